// taskport's page: submit a task and watch it, on the JS client (/static/taskport.js). No build step.
// Task types and example payloads come from the OpenAPI document. Server data is only ever written
// with textContent. The branches follow seed 002: a 10001 ("bill unpaid"), whole task or item, shows
// the settle-the-bill guidance; other codes show their message; when the waiting limit runs out the
// task is "still running: check the history later", not an error.
import {
  cancelTask, configure, getTask, listHistory, retryTask, submitTask, TERMINAL, watchTask,
} from "/static/taskport.mjs";
import { batchButton, callbackText, initBatchView } from "/static/batch.mjs";
import { localTime, tick, timeOf } from "/static/times.mjs";

const BILL_UNPAID = 10001;
const RERUNNABLE = ["FAILED", "CANCELLED"]; // a task in these statuses can run again (POST /tasks/{id}/retry)
const HISTORY_PAGE = 10;
const OUTPUT_SHOWN = 500; // output lines kept on the page (the oldest go first); the API keeps up to 10,000
const $ = (id) => document.getElementById(id);
const examples = new Map();
let watcher = null; // the current watchTask handle
let current = null; // the last status document shown
let announced = { status: null, decile: -1 };
let outputCount = 0; // output lines of the watched task received so far
const pages = { cursors: [null], index: 0 };
const rowDocs = new WeakMap(); // history row -> the latest status document it shows

function useKey() {
  configure({ apiKey: $("api-key").value.trim() });
}

// `taskId`: the notice speaks of that task's state ("Cancellation requested."), so it goes once the task ends.
function notice(text, isError, taskId) {
  const box = $("notice");
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = !text;
  if (taskId) box.dataset.taskId = taskId;
  else delete box.dataset.taskId;
}

// A notice about a task no longer holds once that task has ended, or another task is shown.
function dropStaleNotice(doc) {
  const about = $("notice").dataset.taskId;
  if (about && (about !== doc.task_id || TERMINAL.includes(doc.status))) notice("");
}

function describe(error) {
  if (!error || error.status === undefined) return String(error);
  if (error.status === 0) return "The service did not answer: " + error.detail;
  let text = error.status + " " + error.title + (error.detail ? ": " + error.detail : "");
  for (const [field, messages] of Object.entries(error.errors || {})) {
    text += "\n• " + field + ": " + [].concat(messages).join(" ");
  }
  if (error.status === 401) text += "\nThis service needs an API key: enter one above.";
  return text;
}

async function loadTypes() {
  try {
    const response = await fetch("/api/v1/openapi.json", { headers: { Accept: "application/json" } });
    const doc = await response.json();
    const body = doc.paths["/api/v1/tasks"].post.requestBody.content["application/json"];
    for (const [type, example] of Object.entries(body.examples || {})) examples.set(type, example.value.payload);
  } catch (e) {
    notice("Could not load the task types: " + e, true);
  }
  $("task-type").replaceChildren(...[...examples.keys()].map((type) => new Option(type, type)));
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
    $("payload").focus();
    return;
  }
  useKey();
  $("submit").disabled = true;
  try {
    const doc = await submitTask($("task-type").value, payload, {
      priority: $("priority").value || undefined,
      idempotencyKey: $("idempotency-key").value.trim() || undefined,
      delay: $("delay").value ? Number($("delay").value) : undefined,
    });
    notice("");
    watch(doc);
  } catch (error) {
    if (error.duplicate && error.existing) {
      notice("An identical task was submitted moments ago: showing that one.");
      watch(error.existing);
    } else {
      notice(describe(error), true);
    }
  } finally {
    $("submit").disabled = false;
    loadHistory();
  }
}

function resetTaskView() {
  for (const id of ["outcome", "guidance", "failures-box", "result-box", "download"]) $(id).hidden = true;
  $("failures").tBodies[0].replaceChildren();
  const link = $("download");
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  announced = { status: null, decile: -1 };
  $("output").replaceChildren();
  $("output-box").hidden = true;
  outputCount = 0;
}

// One line of the task's output, at the end of the list; the list keeps the newest OUTPUT_SHOWN and stays
// scrolled to the end unless the reader scrolled up to read.
function showOutput(line) {
  const list = $("output");
  const atEnd = list.scrollHeight - list.scrollTop - list.clientHeight < 8;
  const item = document.createElement("li");
  item.textContent = line.text;
  item.title = line.at;
  item.dataset.id = line.id;
  list.append(item);
  while (list.childElementCount > OUTPUT_SHOWN) list.firstElementChild.remove();
  outputCount += 1;
  $("output-count").textContent = outputCount > OUTPUT_SHOWN ? `(the last ${OUTPUT_SHOWN} of ${outputCount} lines)`
    : `(${outputCount} line${outputCount === 1 ? "" : "s"})`;
  $("output-box").hidden = false;
  if (atEnd) list.scrollTop = list.scrollHeight;
}

function watch(doc) {
  if (watcher) watcher.stop();
  delete $("task").dataset.outcome;
  resetTaskView();
  render(doc);
  $("task").hidden = false;
  $("task-title").scrollIntoView({ block: "nearest" });
  watcher = watchTask(doc.task_id, {
    onProgress: render,
    onOutput: showOutput,
    onQueued: (queue) => { // a fresher place than the stream's first document (render shows each document's)
      if (current && current.status === "PENDING") $("queue-place").replaceChildren(...placeInLine(queue));
    },
    onMode: (mode) => {
      $("mode").textContent = mode === "stream" ? "live (event stream)" : "polling (as Retry-After says)";
      $("mode").dataset.mode = mode;
    },
    onCompleted: showResult,
    onPartialFailure: showFailures,
    onFailed: (error) => {
      outcome(`Failed: ${error.message} (code ${error.code}).`, "failed");
      if (error.code === BILL_UNPAID) $("guidance").hidden = false;
    },
    onCancelled: () => outcome("Cancelled.", "cancelled"),
    onExpired: (d) => outcome("Expired" + (d && d.error ? `: ${d.error.message}.` : "."), "expired"),
    onStillRunning: () => outcome("Still running — check the history later.", "still-running"),
    onError: (error) => notice(describe(error), true),
  }, limits());
  const handle = watcher;
  handle.done.then((result) => {
    if (watcher !== handle) return;
    $("cancel").disabled = true;
    $("task").dataset.outcome = result;
    loadHistory();
  });
}

// The form's "Waiting limits", for following a task or a batch.
function limits() {
  return { maxAttempts: Number($("max-attempts").value) || 60, deadline: (Number($("deadline").value) || 600) * 1000 };
}

function render(doc) {
  current = doc;
  $("task").dataset.taskId = doc.task_id;
  $("task-id").textContent = doc.task_id;
  $("type").textContent = doc.type;
  $("status").textContent = doc.status;
  $("status").className = "badge " + doc.status;
  $("progress").value = doc.progress;
  $("percent").textContent = doc.progress + "%";
  $("message").textContent = doc.message || "–";
  const items = doc.items; // null for a task that does not report items: then the row is left out
  $("items-term").hidden = $("items").hidden = !items;
  if (items) {
    $("succeeded").textContent = items.succeeded;
    $("failed").textContent = items.failed;
    $("total").textContent = items.total;
  }
  $("attempts").textContent = String(doc.attempts);
  const resumed = doc.resumed || 0; // runs that continued from a checkpoint: shown only when some did
  $("resumed").textContent = resumed > 0 ? "resumed " + resumed : "";
  $("resumed").hidden = resumed <= 0;
  $("created").replaceChildren(timeOf(doc.created_at));
  $("updated").replaceChildren(timeOf(doc.updated_at));
  showBatchOf(doc.batch_id);
  $("callback").textContent = doc.callback ? callbackText(doc.callback) : "";
  $("callback-term").hidden = $("callback").hidden = !doc.callback;
  $("cancel").disabled = TERMINAL.includes(doc.status);
  $("rerun").hidden = !RERUNNABLE.includes(doc.status);
  showWaiting(doc);
  announce(doc);
  dropStaleNotice(doc);
  followRow(doc);
}

// The batch the task was submitted in (or whose then task it is): a button that opens the batch's panel, drawn
// again only when it changes (render runs on every event, and a redraw would take the focus away).
function showBatchOf(batchId) {
  const cell = $("batch-of");
  if (cell.dataset.batchId !== (batchId || "")) {
    cell.dataset.batchId = batchId || "";
    cell.replaceChildren(...(batchId ? [batchButton(batchId)] : []));
  }
  $("batch-of-term").hidden = cell.hidden = !batchId;
}

// A PENDING task may wait for its time (`run_at`), for other tasks (`waiting_for`) or, a batch's then task,
// for its batch (`waiting_for` holds the batch's id): say which.
function showWaiting(doc) {
  const pending = doc.status === "PENDING";
  const runAt = pending && doc.run_at;
  const entries = (pending && doc.waiting_for) || [];
  const ids = entries.filter((entry) => !isReason(entry));
  const reasons = entries.filter(isReason);
  $("runs-at").replaceChildren(...(runAt ? ["runs at ", timeOf(doc.run_at)] : []));
  const queue = pending && doc.queue; // in its queue: its place in line, and when it should start
  $("queue-place").replaceChildren(...(queue ? placeInLine(queue) : []));
  if (waitsForBatch(doc)) {
    $("waiting-for").replaceChildren("waiting for its batch: ", batchButton(doc.batch_id));
  } else {
    const links = ids.flatMap((id, i) => [i ? ", " : ": ", taskButton(id, () => openTask(id))]);
    $("waiting-for").replaceChildren(...(ids.length ? [waitingCount(ids)] : []), ...links,
                                     ...reasons.map((reason, i) => (ids.length || i ? "; " : "") + reason));
  }
  $("waiting").hidden = !runAt && !entries.length && !queue;
}

// "3 tasks ahead, starts 7 Dec 2026, 12:01:05 (in 40 s)": position counts the tasks that start before it;
// the estimate is null until its queue has a measured rate.
function placeInLine(queue) {
  const start = queue.estimated_start ? [", starts ", timeOf(queue.estimated_start)] : [];
  return [aheadText(queue.position), ...start];
}

const aheadText = (n) => (n === 0 ? "next in line" : `${n} task${n === 1 ? "" : "s"} ahead`);

// An entry of `waiting_for` that is a reason, not a task id: a concurrency limit's ("concurrency: <type> <key>
// <value> 2/2", docs/api.md#limits), shown as it is.
const isReason = (entry) => entry.includes(": ");

const waitsForBatch = (doc) => Boolean(doc.batch_id && doc.waiting_for && doc.waiting_for.includes(doc.batch_id));

const runsAt = (iso) => "runs at " + localTime(iso);
const waitingCount = (ids) => `waiting for ${ids.length} task${ids.length === 1 ? "" : "s"}`;

// The history's one-line version of the same: the status, and what a PENDING task waits for.
function statusLine(doc) {
  if (doc.status !== "PENDING") return doc.status;
  if (doc.run_at) return doc.status + " · " + runsAt(doc.run_at);
  if (doc.queue) return doc.status + " · " + aheadText(doc.queue.position);
  if (waitsForBatch(doc)) return doc.status + " · waiting for its batch";
  const reason = (doc.waiting_for || []).find(isReason);
  if (reason) return doc.status + " · " + reason;
  if (doc.waiting_for && doc.waiting_for.length) return doc.status + " · " + waitingCount(doc.waiting_for);
  return doc.status;
}

function taskButton(taskId, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "link";
  button.textContent = taskId.slice(0, 8) + "…";
  button.setAttribute("aria-label", "watch task " + taskId);
  button.addEventListener("click", onClick);
  return button;
}

async function openTask(taskId) {
  useKey();
  try {
    watch(await getTask(taskId));
  } catch (error) {
    notice(describe(error), true);
  }
}

// The live region speaks on a status change and at every tenth of the progress, not at every event.
function announce(doc) {
  const decile = Math.floor(doc.progress / 10);
  if (doc.status === announced.status && decile === announced.decile) return;
  announced = { status: doc.status, decile };
  $("live").textContent = `${doc.status}, ${doc.progress}%` + (doc.message ? `: ${doc.message}` : "");
}

function outcome(text, kind) {
  const box = $("outcome");
  box.textContent = text;
  box.className = "outcome " + kind;
  box.hidden = false;
}

function showFailures(result, { errorCode, failures }) {
  const rows = failures.map((f) => {
    const row = document.createElement("tr");
    for (const value of [f.item, f.code, f.message]) {
      const cell = document.createElement("td");
      cell.textContent = String(value);
      row.append(cell);
    }
    return row;
  });
  $("failures").tBodies[0].replaceChildren(...rows);
  $("failures-box").hidden = false;
  const failed = result.items ? result.items.failed : failures.length;
  outcome(`Completed, but ${failed} item${failed === 1 ? "" : "s"} failed (error code ${errorCode}).`, "partial");
  if (errorCode === BILL_UNPAID || failures.some((f) => f.code === BILL_UNPAID)) $("guidance").hidden = false;
}

function showResult(result) {
  if ($("outcome").hidden) outcome("Completed.", "completed");
  $("result").textContent = JSON.stringify(result.result, null, 2);
  $("result-box").hidden = false;
  const file = result.result && result.result.file;
  if (file && file.url) offerDownload(file);
}

async function offerDownload(file) {
  const link = $("download");
  link.textContent = `Download ${file.name} (${file.size} bytes)`;
  link.download = file.name;
  const key = $("api-key").value.trim();
  if (!key) {
    link.href = file.url;
  } else {
    // A plain link cannot carry the Authorization header: fetch the bytes and link to them.
    const response = await fetch(file.url, { headers: { Authorization: "Bearer " + key } });
    if (!response.ok) return notice(`Download failed: HTTP ${response.status}`, true);
    link.href = URL.createObjectURL(await response.blob());
  }
  link.hidden = false;
}

async function cancel() {
  if (!current) return;
  const taskId = current.task_id;
  useKey();
  try {
    await cancelTask(taskId);
    const ended = current.task_id === taskId && TERMINAL.includes(current.status); // its stream was quicker
    if (!ended) notice("Cancellation requested.", false, taskId);
  } catch (error) {
    notice(describe(error), true);
  }
}

// Run the task again under its own id, then watch it as a new submit is watched.
async function rerun() {
  if (!current) return;
  useKey();
  $("rerun").disabled = true;
  try {
    const doc = await retryTask(current.task_id);
    notice("Queued to run again.", false, doc.task_id);
    watch(doc);
  } catch (error) {
    notice(describe(error), true);
  } finally {
    $("rerun").disabled = false;
    loadHistory();
  }
}

async function loadHistory() {
  useKey();
  const cursor = pages.cursors[pages.index];
  let page;
  try {
    page = await listHistory({ status: $("history-status").value, limit: HISTORY_PAGE, cursor });
  } catch (error) {
    if (error.status !== 401) notice(describe(error), true);
    return;
  }
  const rows = page.tasks.map((doc) => historyRow(latest(doc)));
  $("history").tBodies[0].replaceChildren(...rows);
  $("history-empty").hidden = rows.length > 0;
  pages.cursors[pages.index + 1] = page.nextCursor;
  $("history-prev").disabled = pages.index === 0;
  $("history-next").disabled = !page.nextCursor;
  $("history-page").textContent = "page " + (pages.index + 1);
}

// One row: the id (a button that opens the task), type, status, progress, created. Status and progress follow the
// watched task (followRow), so the row never says 0 % while the panel above says 50 %.
function historyRow(doc) {
  const row = document.createElement("tr");
  row.dataset.taskId = doc.task_id;
  const cells = [taskButton(doc.task_id, () => watch(rowDocs.get(row))), doc.type, "", "", timeOf(doc.created_at)];
  for (const value of cells) {
    const cell = document.createElement("td");
    cell.append(value);
    row.append(cell);
  }
  fillRow(row, doc);
  return row;
}

// The watched task's document when it is the same task and no older (its stream may be ahead of the list).
function latest(doc) {
  const watched = current && current.task_id === doc.task_id && current.updated_at >= doc.updated_at;
  return watched ? current : doc;
}

function fillRow(row, doc) {
  rowDocs.set(row, doc);
  row.cells[2].textContent = statusLine(doc);
  row.cells[3].textContent = doc.progress + "%";
}

function followRow(doc) {
  for (const row of $("history").tBodies[0].rows) if (row.dataset.taskId === doc.task_id) fillRow(row, doc);
}

function turnPage(delta) {
  pages.index = Math.max(0, pages.index + delta);
  loadHistory();
}

function restartHistory() {
  pages.cursors = [null];
  pages.index = 0;
  loadHistory();
}

function start() {
  $("submit-form").addEventListener("submit", submit);
  $("task-type").addEventListener("change", resetPayload);
  $("reset-payload").addEventListener("click", resetPayload);
  $("cancel").addEventListener("click", cancel);
  $("rerun").addEventListener("click", rerun);
  $("history-refresh").addEventListener("click", restartHistory);
  $("history-status").addEventListener("change", restartHistory);
  $("history-prev").addEventListener("click", () => turnPage(-1));
  $("history-next").addEventListener("click", () => turnPage(1));
  $("api-key").addEventListener("change", restartHistory);
  loadTypes();
  loadHistory();
  initBatchView({ taskButton, openTask, notice, describe, limits });
  setInterval(tick, 1000); // "3 s ago" counts on
}

// A module runs after the document is parsed, so the elements are there.
start();
