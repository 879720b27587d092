/*
 * taskport.js: the JavaScript client of the taskport HTTP API (/api/v1). No build step, no dependencies.
 *
 *   Plain script tag:  <script src="/static/taskport.js"></script>   then   window.taskport.submitTask(...)
 *   ES module:         import { submitTask, watchTask } from "/static/taskport.mjs";
 *                      (taskport.mjs re-exports this file; `import "/static/taskport.js"` also works)
 *
 * watchTask follows a task over its event stream, read with fetch() so the API key can be sent as an
 * Authorization header (EventSource cannot send headers); with a read token (`token`, minted by a backend
 * that holds the key) it opens an EventSource whose URL carries it as `?access_token=` (RFC 6750). If the
 * stream cannot be opened it polls the status, waiting as the service's Retry-After says, for at most
 * `maxAttempts` reads and `deadline` ms. When the limit is reached the outcome is "still running: check the
 * history later", not an error. It also hands on the task's output lines (`onOutput`) and its place in line
 * while it waits (`onQueued`). watchBatch follows a batch (submitBatch) the same way until it is DONE.
 *
 * Cross-origin: `configure({baseUrl: "https://tasks.example.com", token})` from a page on another origin
 * that the service lists in TASKPORT_CORS_ORIGINS. Requests carry no cookies; the token or key travels in
 * the Authorization header (or the stream's query), never in a credential mode.
 * Problem+json answers become TaskportError objects (status, type, title, detail, errors).
 * Docs: docs/clients.md.
 */
(function (global) {
  "use strict";
  if (global.taskport) return; // loaded twice (script tag and module import): keep the first, its settings

  const API = "/api/v1";
  const TERMINAL = Object.freeze(["COMPLETED", "FAILED", "CANCELLED", "EXPIRED"]);
  const OUTCOMES = Object.freeze({
    COMPLETED: "COMPLETED", PARTIAL_FAILURE: "PARTIAL_FAILURE", FAILED: "FAILED", CANCELLED: "CANCELLED",
    EXPIRED: "EXPIRED", STILL_RUNNING: "STILL_RUNNING", STOPPED: "STOPPED", ERROR: "ERROR",
    DONE: "DONE", // watchBatch: every task of the batch ended
  });
  const BATCH_DONE = "DONE"; // a batch's status once none of its tasks is PENDING or PROCESSING (else RUNNING)
  const STREAM_RECONNECTS = 3; // a stream that dropped is reopened (with Last-Event-ID) this many times
  const defaults = { baseUrl: "", apiKey: "", token: "", fetch: null };
  const OUTPUT_PAGE = 1000; // lines per GET /tasks/{id}/output, the service's largest page
  // A stream carries a waiting task's place in line in its first document only (tasks ahead of it starting are
  // no change of its own): while it shows the task queued, onQueued gets a fresh place from a status read this
  // often.
  const QUEUE_REFRESH = 5000;

  /** An error answer of the service (RFC 9457 problem details), or status 0 when there was no answer. */
  class TaskportError extends Error {
    constructor(status, body, retryAfter) {
      const problem = body && typeof body === "object" ? body : {};
      const title = problem.title || (status ? "HTTP " + status : "network error");
      super(status + " " + title + (problem.detail ? ": " + problem.detail : ""));
      this.name = "TaskportError";
      this.status = status;
      this.type = problem.type || "about:blank";
      this.title = title;
      this.detail = problem.detail || "";
      this.errors = problem.errors || {}; // {"payload.items.0.quantity": ["message", ...]}
      this.body = problem;
      this.retryAfter = retryAfter; // seconds, or null
      this.duplicate = status === 409 && problem.duplicate === true;
      this.existing = this.duplicate ? problem.existing : null; // the earlier task's status document
      this.taskStatus = problem.task_status || null; // 409 on a task that has ended
      this.error = problem.error || null; // {code, message} of a FAILED task (409 from /result)
    }
  }

  /** Set defaults for every call: {baseUrl (another origin's service, e.g. "https://tasks.example.com"),
   * apiKey, token (a read token from your backend: sent instead of a key), fetch}. */
  function configure(options) {
    Object.assign(defaults, options || {});
    return { ...defaults };
  }

  function settingsOf(options) {
    const s = { ...defaults };
    for (const name of Object.keys(defaults)) if (options && options[name] !== undefined) s[name] = options[name];
    return s;
  }

  function headersOf(s, extra) {
    const h = { Accept: "application/json", ...(extra || {}) };
    const credential = s.token || s.apiKey; // a read token, when given, is what this call may do
    if (credential) h.Authorization = "Bearer " + credential;
    return h;
  }

  // The service's absolute URL of `path` (a path of the API, or an absolute URL it sent): the page's own origin
  // when no baseUrl is set.
  function urlOf(s, path) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(path)) return path;
    const base = s.baseUrl || (global.location ? global.location.origin : "");
    return base.replace(/\/+$/, "") + path;
  }

  function taskPath(id, suffix) {
    return API + "/tasks/" + encodeURIComponent(String(id)) + (suffix || "");
  }

  async function call(s, method, path, init) {
    const doFetch = s.fetch || global.fetch.bind(global);
    try {
      return await doFetch(urlOf(s, path), { method, ...init });
    } catch (e) {
      if (e && e.name === "AbortError") throw e;
      throw new TaskportError(0, { title: "network error", detail: String((e && e.message) || e) }, null);
    }
  }

  async function readJson(response) {
    try {
      return await response.json();
    } catch (e) {
      return null;
    }
  }

  function retryAfterOf(response) {
    const raw = response.headers.get("Retry-After");
    return raw && /^\d{1,7}$/.test(raw.trim()) ? Number(raw) : null;
  }

  async function failWith(response) {
    throw new TaskportError(response.status, await readJson(response), retryAfterOf(response));
  }

  /** POST /tasks. Resolves to the status document (PENDING). A duplicate rejects with `duplicate: true`
   * and `existing` (the earlier task's document). Options: {idempotencyKey, priority, runAt (an ISO 8601
   * string or a Date), delay (seconds), after (task ids), callback (a URL, or {url, events}: where the service
   * POSTs the status document, signed, when the task ends), apiKey, baseUrl}. */
  async function submitTask(type, payload, options) {
    const o = options || {};
    const s = settingsOf(o);
    const body = { type, payload: payload === undefined ? {} : payload };
    if (o.priority) body.priority = o.priority;
    if (o.runAt != null) body.run_at = o.runAt instanceof Date ? o.runAt.toISOString() : o.runAt;
    if (o.delay != null) body.delay = o.delay;
    if (o.after != null) body.after = Array.from(o.after);
    if (o.callback != null) body.callback = callbackBody(o.callback);
    const extra = { "Content-Type": "application/json" };
    if (o.idempotencyKey) extra["Idempotency-Key"] = o.idempotencyKey;
    const response = await call(s, "POST", API + "/tasks", { headers: headersOf(s, extra), body: JSON.stringify(body) });
    if (response.status === 202) return response.json();
    return failWith(response);
  }

  /** GET /tasks/{id}: the status document (an EXPIRED one too, which the service answers with 410). */
  async function getTask(id, options) {
    return (await readStatus(id, settingsOf(options))).doc;
  }

  async function readStatus(id, s, signal) {
    const response = await call(s, "GET", taskPath(id), { headers: headersOf(s), signal });
    if (response.status === 200 || response.status === 410) {
      return { doc: await response.json(), retryAfter: retryAfterOf(response) };
    }
    return failWith(response);
  }

  /** GET /tasks/{id}/result: the result document of a COMPLETED task ({result, items, failures,
   * error_code}). Other answers reject: 202 (still running), 409 (FAILED/CANCELLED: `taskStatus`,
   * `error`), 410 (EXPIRED), 404. */
  async function getResult(id, options) {
    const s = settingsOf(options);
    const response = await call(s, "GET", taskPath(id, "/result"), { headers: headersOf(s) });
    if (response.status === 200) return response.json();
    return failWith(response);
  }

  /** GET /tasks/{id}/result/file: the result file of a COMPLETED task as a Blob (its name is the result's
   * `result.file.name`). Rejects as getResult. Cross-origin too: the bytes are fetched with the token or key. */
  async function getResultFile(id, options) {
    const s = settingsOf(options);
    const response = await call(s, "GET", taskPath(id, "/result/file"), { headers: headersOf(s, { Accept: "*/*" }) });
    if (response.status === 200) return response.blob();
    return failWith(response);
  }

  /** The absolute URL of the task's result file, for a plain link (`<a href download>`): with a token it
   * carries it as `?access_token=` (a link cannot send a header; the token then shows in the browser's
   * history, so keep its ttl short). With a key nothing is added: fetch the bytes with getResultFile. */
  function resultFileUrl(id, options) {
    const s = settingsOf(options);
    const url = urlOf(s, taskPath(id, "/result/file"));
    return s.token ? url + "?access_token=" + encodeURIComponent(s.token) : url;
  }

  /** GET /tasks/{id}/output: one page of the task's output lines, oldest first, after the line `after` (an id
   * from an earlier page or line; none: from the first). Resolves to {lines: [{id, at, text}], next}: pass
   * `next` back as `after`; it is null once the task has ended and every line was served. */
  async function getOutput(id, query, options) {
    const q = query || {};
    return jsonCall(settingsOf(options), "GET", taskPath(id, "/output") + queryOf({ after: q.after, limit: q.limit }), 200,
      undefined, q.signal);
  }

  /** DELETE /tasks/{id}. Resolves to true; an ended task rejects with status 409 and `taskStatus`. */
  async function cancelTask(id, options) {
    const s = settingsOf(options);
    const response = await call(s, "DELETE", taskPath(id), { headers: headersOf(s) });
    if (response.status === 204) return true;
    return failWith(response);
  }

  /** POST /tasks/{id}/retry: run a FAILED or CANCELLED task again under its own id. Resolves to its status
   * document (PENDING); any other state rejects with status 409 and `taskStatus`, an EXPIRED task with 410. */
  async function retryTask(id, options) {
    const s = settingsOf(options);
    const response = await call(s, "POST", taskPath(id, "/retry"), { headers: headersOf(s) });
    if (response.status === 202) return response.json();
    return failWith(response);
  }

  /** GET /tasks: one page of the member's tasks, newest first. Query: {status, type, limit, cursor}.
   * Resolves to {tasks, nextCursor}; pass nextCursor back as `cursor` for the next page (null: last). */
  async function listHistory(query, options) {
    const s = settingsOf(options);
    const response = await call(s, "GET", API + "/tasks" + queryOf(query), { headers: headersOf(s) });
    if (response.status !== 200) return failWith(response);
    const page = await response.json();
    return { tasks: page.tasks, nextCursor: page.next_cursor };
  }

  function schedulePath(id) {
    return API + "/schedules" + (id === undefined ? "" : "/" + encodeURIComponent(String(id)));
  }

  async function jsonCall(s, method, path, expected, body, signal) {
    const init = { headers: headersOf(s, body === undefined ? {} : { "Content-Type": "application/json" }), signal };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await call(s, method, path, init);
    if (response.status === expected) return expected === 204 ? true : response.json();
    return failWith(response);
  }

  /** POST /schedules: every fire time of `cron` (5 fields, read in `timezone`, default UTC) submits a task of
   * `type` with `payload`. Options: {timezone, name, priority, paused}. Resolves to the schedule document;
   * a bad cron, time zone or task rejects with 422 (`errors` names the field), the member's cap with 429. */
  async function createSchedule(cron, type, payload, options) {
    const o = options || {};
    const task = { type, payload: payload === undefined ? {} : payload };
    if (o.priority) task.priority = o.priority;
    const body = { cron, task, paused: Boolean(o.paused) };
    if (o.timezone) body.timezone = o.timezone;
    if (o.name) body.name = o.name;
    return jsonCall(settingsOf(o), "POST", schedulePath(), 201, body);
  }

  /** GET /schedules: one page of the member's schedules, newest first. Query: {limit, cursor}. Resolves to
   * {schedules, nextCursor}; pass nextCursor back as `cursor` for the next page (null: last). */
  async function listSchedules(query, options) {
    const page = await jsonCall(settingsOf(options), "GET", schedulePath() + queryOf(query), 200);
    return { schedules: page.schedules, nextCursor: page.next_cursor };
  }

  /** GET /schedules/{id}: the schedule document (someone else's or an unknown id rejects with 404). */
  async function getSchedule(id, options) {
    return jsonCall(settingsOf(options), "GET", schedulePath(id), 200);
  }

  /** PATCH /schedules/{id} with `changes` ({paused, cron, timezone, task}): the changed document. */
  async function updateSchedule(id, changes, options) {
    return jsonCall(settingsOf(options), "PATCH", schedulePath(id), 200, changes || {});
  }

  /** DELETE /schedules/{id}. Resolves to true (the tasks it created stay). */
  async function deleteSchedule(id, options) {
    return jsonCall(settingsOf(options), "DELETE", schedulePath(id), 204);
  }

  function batchPath(id, suffix) {
    return API + "/batches" + (id === undefined ? "" : "/" + encodeURIComponent(String(id)) + (suffix || ""));
  }

  // A callback as the API takes it: a bare URL means {url} (every terminal status).
  const callbackBody = (callback) => (typeof callback === "string" ? { url: callback } : { ...callback });

  function queryOf(query) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query || {})) {
      if (value !== undefined && value !== null && value !== "") params.set(name, String(value));
    }
    const qs = params.toString();
    return qs ? "?" + qs : "";
  }

  /** POST /batches: `tasks` (1 to 1,000 submit bodies, {type, payload, ...}) as one batch, all or nothing.
   * Options: {then (one more submit body, queued once every task ended), callback (a URL or {url, events}: the
   * batch document is POSTed there, signed, once it is DONE), apiKey, baseUrl}. Resolves to the batch document
   * with `tasks`: [{task_id, status, duplicate}] in order; a bad task rejects with 422 whose `errors` name it
   * by index ("tasks.3.payload.items.0.quantity"), the active-task cap (which counts every task) with 429. */
  async function submitBatch(tasks, options) {
    const o = options || {};
    const body = { tasks: Array.from(tasks || []) };
    if (o.then != null) body.then = o.then;
    if (o.callback != null) body.callback = callbackBody(o.callback);
    return jsonCall(settingsOf(o), "POST", batchPath(), 202, body);
  }

  /** GET /batches/{id}: the batch document ({status: RUNNING or DONE, counts, progress, items, then_task_id,
   * callback, links}); an unknown or someone else's batch rejects with 404. */
  async function getBatch(id, options) {
    return jsonCall(settingsOf(options), "GET", batchPath(id), 200);
  }

  /** GET /batches/{id}/tasks: one page of the batch's tasks (status documents) in submit order. Query: {status,
   * limit, cursor}. Resolves to {tasks, nextCursor}; pass nextCursor back as `cursor` (null: the last page). */
  async function listBatchTasks(id, query, options) {
    const page = await jsonCall(settingsOf(options), "GET", batchPath(id, "/tasks") + queryOf(query), 200);
    return { tasks: page.tasks, nextCursor: page.next_cursor };
  }

  /** DELETE /batches/{id}: cancels its unfinished tasks and its then task. Resolves to true. */
  async function cancelBatch(id, options) {
    return jsonCall(settingsOf(options), "DELETE", batchPath(id), 204);
  }

  /** A tiny text/event-stream parser: feed it text, it calls onEvent({event, id, data}) per event. */
  function sseParser(onEvent) {
    let buffer = "";
    let event = { event: "message", id: null, data: [] };
    function line(text) {
      if (text === "") {
        if (event.data.length) onEvent({ event: event.event, id: event.id, data: event.data.join("\n") });
        event = { event: "message", id: event.id, data: [] };
        return;
      }
      if (text[0] === ":") return; // a comment: the service's keep-alive
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "event") event.event = value;
      else if (field === "data") event.data.push(value);
      else if (field === "id") event.id = value;
    }
    return function feed(text) {
      buffer += text;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        line(buffer.slice(0, end).replace(/\r$/, ""));
        buffer = buffer.slice(end + 1);
      }
    };
  }

  function sleep(ms, signal) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, Math.max(0, ms));
      if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
    });
  }

  /**
   * Follow a task until it ends, calling the handlers:
   *   onProgress(doc)                       every status document (progress, message, items)
   *   onCompleted(result)                   COMPLETED: the result document
   *   onPartialFailure(result, {errorCode, failures})  COMPLETED with failed items (called before onCompleted)
   *   onFailed(error, doc)                  FAILED: error = {code, message}; code a business code (10001...) or < 0
   *   onCancelled(doc), onExpired(doc)
   *   onStillRunning(doc, {attempts})       the limit ran out: still running, check the history later
   *   onError(taskportError)                the service refused (404, 401, ...) or could not be reached
   *   onMode(mode)                          "stream" or "polling", when it changes
   *   onQueued(queue)                       a PENDING document that waits in its queue: {position (tasks that
   *                                         start before it), estimated_start (ISO 8601, or null: no rate yet)}
   *   onOutput(line)                        each line of the task's output once, in order: {id, at, text}
   * Options: {maxAttempts = 60, deadline (ms, default none), sse = true, pollInterval = 1000 (ms, when the
   *   service sends no Retry-After), apiKey, token, baseUrl}. `token` (a read token) may also sit beside the
   *   handlers: watchTask(id, {token, onOutput}). With a token the stream is an EventSource, the token in its
   *   URL. Every status read and every stream connection is an attempt (output pages are not).
   *   Returns {stop(), done}: `done` resolves to the outcome, one of taskport.OUTCOMES.
   */
  function watchTask(id, handlers, options) {
    const h = handlers || {};
    const o = h.token && !(options && options.token) ? { ...(options || {}), token: h.token } : options;
    return follow({
      events: taskPath(id, "/events"), event: "status", ends: (doc) => TERMINAL.includes(doc.status),
      read: (s, signal) => readStatus(id, s, signal), finish: (doc, s, emit) => finishTask(id, doc, s, emit),
      output: typeof h.onOutput === "function" ? (after, s, signal) => getOutput(id, { after, signal }, s) : null,
      queued: true,
    }, h, o);
  }

  /**
   * Follow a batch until it is DONE (every task of it ended), over its event stream (one document per change,
   * coalesced), polling GET /batches/{id} if the stream cannot be opened. Handlers: onProgress(doc) every batch
   * document (status, counts, progress, items), onDone(doc) the DONE one, onStillRunning(doc, {attempts}),
   * onError(taskportError), onMode(mode). Options and the returned {stop(), done} as watchTask's; `done`
   * resolves to OUTCOMES.DONE, STILL_RUNNING, STOPPED or ERROR.
   */
  function watchBatch(id, handlers, options) {
    return follow({
      events: batchPath(id, "/events"), event: "batch", ends: (doc) => doc.status === BATCH_DONE,
      read: async (s, signal) => ({ doc: await jsonCall(s, "GET", batchPath(id), 200, undefined, signal), retryAfter: null }),
      finish: async (doc, s, emit) => { emit("onDone", doc); return OUTCOMES.DONE; },
    }, handlers, options);
  }

  async function finishTask(id, doc, s, emit) {
    if (doc.status === "COMPLETED") {
      const result = await getResult(id, s);
      const failures = result.failures || [];
      let outcome = OUTCOMES.COMPLETED;
      if (failures.length || (result.items && result.items.failed) || result.error_code != null) {
        outcome = OUTCOMES.PARTIAL_FAILURE;
        emit("onPartialFailure", result, { errorCode: result.error_code, failures });
      }
      emit("onCompleted", result);
      return outcome;
    }
    if (doc.status === "FAILED") { emit("onFailed", doc.error || { code: null, message: "" }, doc); return OUTCOMES.FAILED; }
    if (doc.status === "CANCELLED") { emit("onCancelled", doc); return OUTCOMES.CANCELLED; }
    emit("onExpired", doc);
    return OUTCOMES.EXPIRED;
  }

  // What watchTask and watchBatch share: the event stream at `target.events` (documents in `target.event`
  // events, reopened with Last-Event-ID after a drop) until `target.ends(doc)`, polling `target.read` when it
  // cannot be opened, within the limits; then `target.finish(doc, settings, emit)` gives the outcome.
  // `target.output(after, settings, signal)`, when the caller wants output lines, reads a page of them: the
  // stream's `output` events hand them on as they come, and this reads what polling (or the end) still owes.
  function follow(target, handlers, options) {
    const h = handlers || {};
    const o = { maxAttempts: 60, deadline: null, sse: true, pollInterval: 1000, ...(options || {}) };
    const s = settingsOf(o);
    const controller = new AbortController();
    const until = o.deadline ? Date.now() + o.deadline : Infinity;
    const state = { attempts: 0, last: null, mode: null, timedOut: false, outputAfter: null };
    let deadlineTimer = null;
    if (until !== Infinity) {
      deadlineTimer = setTimeout(() => { state.timedOut = true; controller.abort(); }, o.deadline);
    }
    const emit = (name, ...args) => { if (typeof h[name] === "function") h[name](...args); };
    const setMode = (mode) => { if (state.mode !== mode) { state.mode = mode; emit("onMode", mode); } };
    const exhausted = () => state.attempts >= o.maxAttempts || Date.now() >= until;
    const seen = (doc) => {
      state.last = doc;
      emit("onProgress", doc);
      if (doc.status === "PENDING" && doc.queue) {
        emit("onQueued", doc.queue);
        if (state.mode === "stream") refreshPlace();
      }
      return target.ends(doc);
    };
    const queuedNow = () => state.last && state.last.status === "PENDING" && state.last.queue;

    // While the stream shows the task waiting in its queue: its place again, every QUEUE_REFRESH ms, for onQueued
    // alone (the stream's documents stay what onProgress sees). Not an attempt; a failed read is skipped.
    let placeTimer = null;
    function refreshPlace() {
      if (!target.queued || typeof h.onQueued !== "function" || placeTimer !== null) return;
      placeTimer = setTimeout(async () => {
        try {
          const { doc } = await target.read(s, controller.signal);
          if (queuedNow() && doc.status === "PENDING" && doc.queue) emit("onQueued", doc.queue);
        } catch (e) {
          // the stream (or polling) says what matters
        }
        placeTimer = null;
        if (queuedNow() && state.mode === "stream" && !controller.signal.aborted) refreshPlace();
      }, QUEUE_REFRESH);
    }
    const line = (output) => {
      if (output.id === state.outputAfter) return; // the same line again (a stream resumed at it)
      state.outputAfter = output.id;
      emit("onOutput", output);
    };

    // The output lines the stream has not brought: one full page after another while the task runs, every
    // page up to `next: null` once it has ended. A failed read leaves them to the next poll (or drops them at
    // the end): output never decides an outcome.
    async function readOutput(ended) {
      if (!target.output) return;
      try {
        for (;;) {
          const page = await target.output(state.outputAfter, s, controller.signal);
          page.lines.forEach(line);
          if (page.next === null || !page.lines.length || (!ended && page.lines.length < OUTPUT_PAGE)) return;
        }
      } catch (e) {
        if (e.name === "AbortError") throw e;
      }
    }

    // With a read token: an EventSource (it cannot send headers, so the token rides in the query, RFC 6750).
    // The browser reopens a dropped one itself with Last-Event-ID; each reopening is an attempt, and after
    // STREAM_RECONNECTS in a row polling takes over. A stream the service refused (401, 404, 410...) cannot
    // say why: polling reads the answer and reports it. Resolves to the last document, or null.
    function eventSource() {
      return new Promise((resolve, reject) => {
        let source = null;
        let drops = 0;
        const end = (doc) => {
          source.close();
          controller.signal.removeEventListener("abort", stopped);
          resolve(doc);
        };
        const stopped = () => { source.close(); reject(new DOMException("stopped", "AbortError")); };
        controller.signal.addEventListener("abort", stopped, { once: true });
        state.attempts += 1;
        source = new global.EventSource(urlOf(s, target.events) + "?access_token=" + encodeURIComponent(s.token));
        source.onopen = () => setMode("stream");
        source.addEventListener(target.event, (event) => {
          drops = 0;
          const doc = JSON.parse(event.data);
          if (seen(doc)) end(doc);
        });
        if (target.output) source.addEventListener("output", (event) => line(JSON.parse(event.data)));
        source.onerror = () => {
          if (source.readyState === global.EventSource.CLOSED) return end(null);
          drops += 1; // CONNECTING: the browser reopens it
          if (drops > STREAM_RECONNECTS || exhausted()) return end(null);
          state.attempts += 1;
        };
      });
    }

    async function stream() {
      let lastId = null;
      let drops = 0;
      while (drops <= STREAM_RECONNECTS && !exhausted()) {
        state.attempts += 1;
        const headers = headersOf(s, { Accept: "text/event-stream" });
        if (lastId !== null) headers["Last-Event-ID"] = lastId;
        let response;
        try {
          response = await call(s, "GET", target.events, { headers, signal: controller.signal, cache: "no-store" });
        } catch (e) {
          if (e.name === "AbortError" || lastId === null) throw e; // never opened: the caller polls
          drops += 1;
          await sleep(200 * drops, controller.signal);
          continue;
        }
        if (response.status === 410) {
          const expired = await response.json();
          seen(expired);
          return expired;
        }
        if (response.status !== 200 || !response.body) {
          if (lastId === null && response.status !== 503) return failWith(response);
          drops += 1;
          await sleep((retryAfterOf(response) || 1) * 1000, controller.signal);
          continue;
        }
        setMode("stream");
        let last = null;
        const feed = sseParser((event) => {
          if (last) return;
          if (event.id !== null) lastId = event.id; // one id resumes the documents and the output alike
          if (event.event === "output" && target.output) {
            line(JSON.parse(event.data));
            return;
          }
          if (event.event !== target.event) return;
          drops = 0;
          const doc = JSON.parse(event.data);
          if (seen(doc)) last = doc;
        });
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        try {
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            feed(decoder.decode(value, { stream: true }));
            if (last) return last;
          }
        } catch (e) {
          if (e.name === "AbortError" || controller.signal.aborted) throw e;
        } finally {
          reader.cancel().catch(() => {});
        }
        if (last) return last;
        drops += 1; // dropped before the end: reopen with Last-Event-ID
        await sleep(200 * drops, controller.signal);
      }
      return null;
    }

    async function poll() {
      setMode("polling");
      while (!exhausted()) {
        state.attempts += 1;
        let delay = o.pollInterval;
        try {
          const { doc, retryAfter } = await target.read(s, controller.signal);
          if (seen(doc)) return doc;
          await readOutput(false);
          if (retryAfter) delay = retryAfter * 1000;
        } catch (e) {
          if (e.name === "AbortError") throw e;
          if (e.status !== 0 && e.status !== 503) throw e; // 404, 401...: polling again will not help
          if (e.retryAfter) delay = e.retryAfter * 1000;
        }
        if (exhausted()) break;
        await sleep(Math.min(delay, until - Date.now()), controller.signal);
        if (controller.signal.aborted) throw new DOMException("stopped", "AbortError");
      }
      return null;
    }

    async function run() {
      let doc = null;
      if (o.sse && s.token && typeof global.EventSource === "function") {
        doc = await eventSource();
      } else if (o.sse && typeof ReadableStream !== "undefined" && typeof TextDecoder !== "undefined") {
        try {
          doc = await stream();
        } catch (e) {
          if (e.name === "AbortError" || (e instanceof TaskportError && e.status !== 0 && e.status !== 503)) throw e;
        }
      }
      if (!doc) doc = await poll();
      if (!doc) {
        emit("onStillRunning", state.last, { attempts: state.attempts });
        return OUTCOMES.STILL_RUNNING;
      }
      if (doc.status !== "EXPIRED") await readOutput(true); // what the stream did not bring before it ended
      return target.finish(doc, s, emit);
    }

    const done = run().catch((e) => {
      if (e && e.name === "AbortError") {
        if (state.timedOut) {
          emit("onStillRunning", state.last, { attempts: state.attempts });
          return OUTCOMES.STILL_RUNNING;
        }
        return OUTCOMES.STOPPED;
      }
      emit("onError", e);
      return OUTCOMES.ERROR;
    }).finally(() => {
      clearTimeout(deadlineTimer);
      clearTimeout(placeTimer);
    });
    return { stop: () => controller.abort(), done };
  }

  global.taskport = Object.freeze({
    configure, submitTask, getTask, getResult, cancelTask, retryTask, listHistory, watchTask, TaskportError, TERMINAL,
    OUTCOMES, sseParser, createSchedule, listSchedules, getSchedule, updateSchedule, deleteSchedule,
    submitBatch, getBatch, listBatchTasks, watchBatch, cancelBatch, getResultFile, resultFileUrl, getOutput,
  });
})(typeof globalThis !== "undefined" ? globalThis : window);
