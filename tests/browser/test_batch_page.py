"""Batches on the page and in the JS client (issue 21): a task submitted in a batch links to its batch, whose panel
shows its document (status, progress, its tasks by status, its then task) and follows it live over the batch's
event stream, polling when the stream is blocked; a then task that waits says it waits for its batch."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from taskport import Client, ProblemError
from tests.browser.test_page import by_id, outcome, page, row_text, text, until
from tests.integration.harness import REPO_ROOT, Stack, started_stack

__all__ = ["page"]  # the fixture, shared with the page's other tests

SECRET = "whsec_" + base64.b64encode(b"browser batch test secret 32 b!!").decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The page's stack, plus the scheduler (its promote tick queues a batch's then task) and a callback secret
    for the open mode's member."""
    with started_stack(tmp_path_factory.mktemp("browser-batch"), callback_secrets=f"public:{SECRET}") as s:
        s.start_scheduler()
        yield s


def sleep(seconds: float = 0, **extra: Any) -> dict[str, Any]:
    return {"type": "demo.sleep", "payload": {"seconds": seconds, "steps": max(1, int(seconds * 10)), **extra},
            "dedup_key": uuid.uuid4().hex}


def click_history_row(browser: Chrome, task_id: str) -> bool:
    """Refresh the history and open the task's row; False to try again (not listed yet, or redrawn meanwhile)."""
    try:
        by_id(browser, "history-refresh").click()
        browser.find_element(By.CSS_SELECTOR, f'#history button[aria-label="watch task {task_id}"]').click()
        return True
    except Exception:  # noqa: BLE001 - not drawn yet, or stale: the condition is polled again
        return False


def open_task(browser: Chrome, task_id: str) -> None:
    until(browser, lambda b: click_history_row(b, task_id), what=f"task {task_id} in the history")
    until(browser, lambda b: by_id(b, "task").get_attribute("data-task-id") == task_id, what="the task's panel")


def test_a_task_of_a_batch_opens_its_batch_which_is_followed_live_to_done(page: Chrome, stack: Stack,
                                                                         artifacts: Path) -> None:
    with Client(stack.base_url) as client:
        accepted = client.submit_batch([sleep(3), sleep(0, fail_code=20002)], then=sleep(0))
    batch_id, then_id = accepted["batch_id"], accepted["then_task_id"]
    first = accepted["tasks"][0]["task_id"]
    open_task(page, first)
    until(page, lambda b: by_id(b, "batch-of").is_displayed(), what="the task's batch")
    link = by_id(page, "batch-of").find_element(By.TAG_NAME, "button")
    assert link.get_attribute("aria-label") == f"open batch {batch_id}"
    link.click()
    until(page, lambda b: by_id(b, "batch").is_displayed() and text(b, "batch-id") == batch_id, what="the batch")
    until(page, lambda b: by_id(b, "batch-mode").get_attribute("data-mode") == "stream", what="the batch's stream")
    assert text(page, "batch-status") == "RUNNING"
    until(page, lambda b: by_id(b, "batch").get_attribute("data-outcome") == "DONE", what="the batch to end")
    assert text(page, "batch-status") == "DONE" and text(page, "batch-percent") == "100%"
    assert text(page, "batch-counts") == "1 completed, 1 failed of 2"
    assert by_id(page, "batch-completed").find_element(By.TAG_NAME, "time").get_attribute("title")
    assert not by_id(page, "batch-items").is_displayed()  # demo.sleep without items reports none
    page.execute_script("document.getElementById('batch').scrollIntoView()")
    page.save_screenshot(str(artifacts / "batch.png"))
    by_id(page, "batch-then").find_element(By.CSS_SELECTOR, f'button[aria-label="watch task {then_id}"]').click()
    until(page, lambda b: by_id(b, "task").get_attribute("data-task-id") == then_id, what="the then task")
    assert outcome(page) == "COMPLETED" and text(page, "type") == "demo.sleep"


def test_a_waiting_then_task_says_it_waits_for_its_batch_and_polling_follows_a_blocked_batch(
        page: Chrome, stack: Stack) -> None:
    with Client(stack.base_url) as client:
        accepted = client.submit_batch([sleep(30)], then=sleep(0))
        try:
            open_task(page, accepted["then_task_id"])
            until(page, lambda b: text(b, "waiting-for").startswith("waiting for its batch: "),
                  what="the then task waiting for its batch")
            until(page, lambda b: "PENDING · waiting for its batch" in (row_text(b, accepted["then_task_id"]) or ""),
                  what="its history row waiting for its batch")
            page.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events"]})
            by_id(page, "waiting-for").find_element(By.TAG_NAME, "button").click()
            until(page, lambda b: text(b, "batch-id") == accepted["batch_id"] and
                  by_id(b, "batch-mode").get_attribute("data-mode") == "polling", what="the batch, polled")
            client.cancel_batch(accepted["batch_id"])
            until(page, lambda b: by_id(b, "batch").get_attribute("data-outcome") == "DONE", what="the batch DONE")
            assert text(page, "batch-counts") == "1 cancelled of 1"  # the batch's own tasks: then is not counted
        finally:
            page.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
            with contextlib.suppress(ProblemError):  # already cancelled when the test got that far
                client.cancel_batch(accepted["batch_id"])


def test_the_js_client_submits_follows_pages_and_cancels_a_batch(page: Chrome) -> None:
    answer = page.execute_async_script(
        "const done = arguments[arguments.length - 1]; const tp = window.taskport; const seen = [];"
        "const body = (extra) => ({ type: 'demo.sleep', payload: { seconds: 0, ...extra },"
        " dedup_key: crypto.randomUUID() });"
        "(async () => {"
        "  const batch = await tp.submitBatch([body({}), body({ fail_code: 20002 })], { then: body({}) });"
        "  const outcome = await tp.watchBatch(batch.batch_id, { onProgress: (d) => seen.push(d.status) }).done;"
        "  const failed = await tp.listBatchTasks(batch.batch_id, { status: 'FAILED' });"
        "  const long = await tp.submitBatch([{ type: 'demo.sleep', payload: { seconds: 30 } }]);"
        "  const cancelled = await tp.cancelBatch(long.batch_id);"
        "  const missing = await tp.getBatch(crypto.randomUUID()).catch((e) => [e.name, e.status]);"
        "  const refused = await tp.submitTask('demo.sleep', {}, { callback: 'https://10.1.2.3/hook' })"
        "    .catch((e) => [e.status, Object.keys(e.errors)]);"
        "  return { outcome, last: seen[seen.length - 1], failed: failed.tasks.map((t) => t.status),"
        "           next: failed.nextCursor, cancelled, missing, refused };"
        "})().then(done, (e) => done(String(e)));")
    assert answer == {"outcome": "DONE", "last": "DONE", "failed": ["FAILED"], "next": None, "cancelled": True,
                      "missing": ["TaskportError", 404], "refused": [422, ["callback.url"]]}, answer


def docs_batch_snippet() -> str:
    """The batch JS snippet of docs/clients.md, as an async function body (its static import made dynamic)."""
    text = (REPO_ROOT / "docs" / "clients.md").read_text()
    code = text.split("<!-- snippet:js-batch -->")[1].split("<!-- /snippet:js-batch -->")[0]
    code = code.split("```js")[1].split("```")[0]
    statement = 'import { listBatchTasks, submitBatch, watchBatch } from "/static/taskport.mjs";'
    assert statement in code
    return code.replace(statement, "const { listBatchTasks, submitBatch, watchBatch } = await import("
                                   '"/static/taskport.mjs");')


def test_the_docs_js_batch_snippet_runs_as_written(page: Chrome) -> None:
    calls = page.execute_async_script(
        "const finish = arguments[arguments.length - 1]; const calls = [];"
        "const record = (name) => (...args) => calls.push([name, ...args.map((a) => JSON.stringify(a))]);"
        "const [showBatch, showError] = ['batch', 'error'].map(record);"
        "const console = { log: record('log') };"
        "(async () => {" + docs_batch_snippet() + "})()"
        ".then(() => finish(calls), (e) => finish([['thrown', String(e)]]));")
    names = [c[0] for c in calls]
    assert "thrown" not in names and "error" not in names, calls
    assert [c for c in calls if c[0] == "log"] == [["log", '"DONE"'], ["log", "1"]]
    assert names.count("batch") >= 1 and calls[names.index("log") - 1][1] == '"DONE"'  # the DONE document last
