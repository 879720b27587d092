// taskport's page: submit a task and watch it. Vanilla JS, no build step.
// Task types and example payloads come from the OpenAPI document. Without an API key a task is
// followed with EventSource (SSE); with a key the status is polled, since EventSource cannot send
// an Authorization header. Server data is only ever written with textContent.
"use strict";

const API = "/api/v1";
const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED", "EXPIRED"]);
const $ = (id) => document.getElementById(id);
const examples = new Map();
let watcher = null; // {stop()} of the current stream or poller
let current = null; // the last status document shown

function apiKey() {
  return $("api-key").value.trim();
}

function headers(json) {
  const h = { Accept: "application/json" };
  if (apiKey()) h.Authorization = "Bearer " + apiKey();
  if (json) h["Content-Type"] = "application/json";
  return h;
}

function notice(text, isError) {
  const box = $("notice");
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = !text;
}

function describeProblem(status, body) {
  if (!body || typeof body !== "object") return "HTTP " + status;
  let text = status + " " + (body.title || "") + (body.detail ? ": " + body.detail : "");
  for (const [field, messages] of Object.entries(body.errors || {})) {
    text += "\n• " + field + ": " + [].concat(messages).join(" ");
  }
  if (status === 401) text += "\nThis service needs an API key: paste one above.";
  return text;
}

async function readJson(response) {
  try {
    return await response.json();
  } catch (e) {
    return null;
  }
}

async function loadTypes() {
  const select = $("task-type");
  try {
    const response = await fetch(API + "/openapi.json", { headers: { Accept: "application/json" } });
    const doc = await response.json();
    const body = doc.paths[API + "/tasks"].post.requestBody.content["application/json"];
    for (const [type, example] of Object.entries(body.examples || {})) examples.set(type, example.value.payload);
  } catch (e) {
    notice("Could not load the task types: " + e, true);
  }
  select.replaceChildren(...[...examples.keys()].map((type) => new Option(type, type)));
  resetPayload();
}

function resetPayload() {
  const payload = examples.get($("task-type").value);
  $("payload").value = JSON.stringify(payload === undefined ? {} : payload, null, 2);
}

async function submit(event) {
  event.preventDefault();
  let payload;
  try {
    payload = JSON.parse($("payload").value || "{}");
  } catch (e) {
    notice("The payload is not valid JSON: " + e.message, true);
    return;
  }
  const body = { type: $("task-type").value, payload };
  if ($("priority").value) body.priority = $("priority").value;
  $("submit").disabled = true;
  try {
    const response = await fetch(API + "/tasks", { method: "POST", headers: headers(true), body: JSON.stringify(body) });
    const data = await readJson(response);
    if (response.status === 202) {
      notice("");
      watch(data);
    } else if (response.status === 409 && data && data.existing) {
      notice("An identical task was submitted moments ago: showing that one.");
      watch(data.existing);
    } else {
      notice(describeProblem(response.status, data), true);
    }
  } catch (e) {
    notice("Network error: " + e, true);
  } finally {
    $("submit").disabled = false;
  }
}

function stopWatching() {
  if (watcher) watcher.stop();
  watcher = null;
}

function watch(doc) {
  stopWatching();
  $("result-box").hidden = true;
  $("download").hidden = true;
  if ($("download").href.startsWith("blob:")) URL.revokeObjectURL($("download").href);
  render(doc);
  if (TERMINAL.has(doc.status)) return finished(doc);
  if (apiKey() || typeof EventSource === "undefined") poll(doc);
  else stream(doc);
}

function stream(doc) {
  $("mode").textContent = "live (server-sent events)";
  const source = new EventSource(doc.links.events);
  source.addEventListener("status", (event) => {
    const data = JSON.parse(event.data);
    render(data);
    if (TERMINAL.has(data.status)) {
      source.close();
      finished(data);
    }
  });
  source.onerror = () => {
    // The browser reconnects by itself (with Last-Event-ID) unless the server refused the stream.
    if (source.readyState === EventSource.CLOSED) poll(current || doc);
  };
  watcher = { stop: () => source.close() };
}

function poll(doc) {
  $("mode").textContent = "polling every second";
  let timer = null;
  let stopped = false;
  const tick = async () => {
    let delay = 1000;
    try {
      const response = await fetch(doc.links.self, { headers: headers(false) });
      const data = await readJson(response);
      if (response.status !== 200 && response.status !== 410) {
        notice(describeProblem(response.status, data), true);
        return;
      }
      render(data);
      if (TERMINAL.has(data.status)) return finished(data);
      delay = (Number(response.headers.get("Retry-After")) || 1) * 1000;
    } catch (e) {
      notice("Network error, retrying: " + e, true);
    }
    if (!stopped) timer = setTimeout(tick, delay);
  };
  watcher = { stop: () => { stopped = true; clearTimeout(timer); } };
  timer = setTimeout(tick, 1000);
}

function render(doc) {
  current = doc;
  $("task").hidden = false;
  $("task-id").textContent = doc.task_id;
  $("status").textContent = doc.status;
  $("status").className = "badge " + doc.status;
  $("progress").value = doc.progress;
  $("percent").textContent = doc.progress + "%";
  $("message").textContent = doc.message || "–";
  const items = doc.items;
  $("items").textContent = items ? `${items.succeeded} succeeded, ${items.failed} failed of ${items.total}` : "–";
  $("error").textContent = doc.error ? `${doc.error.code}: ${doc.error.message}` : "–";
  $("attempts").textContent = String(doc.attempts);
  $("created").textContent = doc.created_at;
  $("updated").textContent = doc.updated_at;
  $("cancel").disabled = TERMINAL.has(doc.status);
}

async function finished(doc) {
  $("mode").textContent = "finished";
  $("cancel").disabled = true;
  if (doc.status !== "COMPLETED") return;
  const response = await fetch(doc.links.result, { headers: headers(false) });
  const data = await readJson(response);
  if (response.status !== 200) return notice(describeProblem(response.status, data), true);
  $("result").textContent = JSON.stringify(data, null, 2);
  $("result-box").hidden = false;
  const file = data.result && data.result.file;
  if (file && file.url) offerDownload(file);
}

async function offerDownload(file) {
  const link = $("download");
  link.textContent = `Download ${file.name} (${file.size} bytes)`;
  link.download = file.name;
  if (!apiKey()) {
    link.href = file.url;
  } else {
    // A plain link cannot carry the Authorization header: fetch the bytes and link to them.
    const response = await fetch(file.url, { headers: { Authorization: "Bearer " + apiKey() } });
    if (!response.ok) return notice(describeProblem(response.status, await readJson(response)), true);
    link.href = URL.createObjectURL(await response.blob());
  }
  link.hidden = false;
}

async function cancel() {
  if (!current) return;
  const response = await fetch(current.links.self, { method: "DELETE", headers: headers(false) });
  if (response.status === 204) notice("Cancelled.");
  else notice(describeProblem(response.status, await readJson(response)), true);
}

document.addEventListener("DOMContentLoaded", () => {
  $("submit-form").addEventListener("submit", submit);
  $("task-type").addEventListener("change", resetPayload);
  $("reset-payload").addEventListener("click", resetPayload);
  $("cancel").addEventListener("click", cancel);
  loadTypes();
});
