// batch.mjs: the page's batch panel. A task submitted in a batch (or a batch's `then` task) links to its batch;
// opening it shows the batch document (status, progress, its tasks by status, items, its then task, the
// callback's delivery) and follows it live over the batch's event stream, polling if that cannot be opened.
// Server data is only ever written with textContent.
import { getBatch, watchBatch } from "/static/taskport.mjs";
import { timeOf } from "/static/times.mjs";

const $ = (id) => document.getElementById(id);
let page = null; // what the page lends this panel: {taskButton, openTask, notice, describe, limits}
let watcher = null; // the current watchBatch handle
let announced = null; // the status the live region last spoke

/** Wire the panel to the page's own helpers (called once, at start). */
export function initBatchView(helpers) {
  page = helpers;
}

/** A button that opens the batch `batchId` (in the task panel, and where a then task waits for its batch). */
export function batchButton(batchId) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "link";
  button.textContent = batchId.slice(0, 8) + "…";
  button.setAttribute("aria-label", "open batch " + batchId);
  button.addEventListener("click", () => openBatch(batchId));
  return button;
}

/** "delivered after 2 attempts (last answer 204)": a callback's state, from a status or batch document. */
export function callbackText(callback) {
  const attempts = callback.attempts || 0;
  let text = callback.state;
  if (attempts) text += ` after ${attempts} attempt${attempts === 1 ? "" : "s"}`;
  if (callback.last_status) text += ` (last answer ${callback.last_status})`;
  return text;
}

/** Show the batch and follow it until it is DONE (or another batch is opened). */
export async function openBatch(batchId) {
  if (watcher) watcher.stop();
  watcher = null;
  delete $("batch").dataset.outcome;
  announced = null;
  let doc;
  try {
    doc = await getBatch(batchId);
  } catch (error) {
    page.notice(page.describe(error), true);
    return;
  }
  renderBatch(doc);
  $("batch").hidden = false;
  $("batch-title").scrollIntoView({ block: "nearest" });
  const handle = watchBatch(batchId, {
    onProgress: renderBatch,
    onMode: (mode) => {
      $("batch-mode").textContent = mode === "stream" ? "live (event stream)" : "polling";
      $("batch-mode").dataset.mode = mode;
    },
    onError: (error) => page.notice(page.describe(error), true),
  }, page.limits());
  watcher = handle;
  handle.done.then((outcome) => {
    if (watcher === handle) $("batch").dataset.outcome = outcome;
  });
}

function renderBatch(doc) {
  $("batch").dataset.batchId = doc.batch_id;
  $("batch-id").textContent = doc.batch_id;
  $("batch-status").textContent = doc.status;
  $("batch-status").className = "badge " + doc.status;
  $("batch-progress").value = doc.progress;
  $("batch-percent").textContent = doc.progress + "%";
  $("batch-counts").textContent = countsText(doc);
  const items = doc.items && doc.items.total ? doc.items : null; // tasks that report no items: left out
  show("batch-items", items && `${items.succeeded} succeeded, ${items.failed} failed of ${items.total}`);
  showThen(doc.then_task_id);
  $("batch-created").replaceChildren(timeOf(doc.created_at));
  $("batch-completed").replaceChildren(...(doc.completed_at ? [timeOf(doc.completed_at)] : []));
  showRow("batch-completed", Boolean(doc.completed_at));
  show("batch-callback", doc.callback && callbackText(doc.callback));
  if (doc.status !== announced) {
    announced = doc.status;
    $("batch-live").textContent = `batch ${doc.status}, ${doc.progress}%`;
  }
}

// "18 completed, 1 failed, 1 processing of 20": the statuses that have tasks, in the document's order.
function countsText(doc) {
  const shown = Object.entries(doc.counts || {}).filter(([, n]) => n > 0).map(([s, n]) => `${n} ${s.toLowerCase()}`);
  return `${shown.join(", ") || "none"} of ${doc.size}`;
}

// The then task: a button that opens it, drawn again only when it changes (a redraw would take the focus away).
function showThen(taskId) {
  const cell = $("batch-then");
  if (cell.dataset.taskId !== (taskId || "")) {
    cell.dataset.taskId = taskId || "";
    const button = taskId ? page.taskButton(taskId, () => page.openTask(taskId)) : null;
    cell.replaceChildren(...(button ? [button, " runs once every task has ended"] : []));
  }
  showRow("batch-then", Boolean(taskId));
}

function show(id, text) {
  if (text) $(id).textContent = text;
  showRow(id, Boolean(text));
}

function showRow(id, visible) {
  $(id).hidden = !visible;
  $(id + "-term").hidden = !visible;
}
