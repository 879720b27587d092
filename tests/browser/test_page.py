"""The page at / and the JS client under it, in headless Chromium against the real stack.

Each test drives the page as a person would (choose a type, edit the payload, submit, watch, cancel,
page through the history) and waits for what the page shows, polling with a deadline.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from app.core import keys
from taskport import Client
from tests.integration.harness import REPO_ROOT, Stack
from tests.integration.proxy import DroppingProxy

WAIT = 20.0


def until(browser: Chrome, condition: Callable[[Chrome], Any], timeout: float = WAIT, what: str = "") -> Any:
    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(condition, message=what)


def by_id(browser: Chrome, element_id: str) -> WebElement:
    return browser.find_element(By.ID, element_id)


def text(browser: Chrome, element_id: str) -> str:
    return str(by_id(browser, element_id).text)


@pytest.fixture
def page(browser: Chrome, stack: Stack) -> Chrome:
    """The page, freshly loaded, with its types in the select and the event stream unblocked."""
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    browser.get(stack.url("/"))
    until(browser, lambda b: len(Select(by_id(b, "task-type")).options) >= 3, what="task types to load")
    return browser


def submit(browser: Chrome, task_type: str, payload: dict[str, Any], max_attempts: int | None = None) -> str:
    """Fill the form as a person would and submit it; returns the id of the task the page now watches."""
    before = by_id(browser, "task").get_attribute("data-task-id")
    Select(by_id(browser, "task-type")).select_by_value(task_type)
    box = by_id(browser, "payload")
    assert json.loads(box.get_attribute("value") or "null") is not None  # prefilled with an example
    box.clear()
    box.send_keys(json.dumps(payload, indent=1))
    if max_attempts is not None:
        browser.find_element(By.TAG_NAME, "summary").click()  # open "Waiting limits"
        field = by_id(browser, "max-attempts")
        field.clear()
        field.send_keys(str(max_attempts))
    key = by_id(browser, "idempotency-key")
    key.clear()
    key.send_keys(uuid.uuid4().hex, Keys.ENTER)  # Enter in a field submits the form: keyboard only
    shown = until(browser, lambda b: by_id(b, "task").get_attribute("data-task-id") not in (None, before) and
                  by_id(b, "task").get_attribute("data-task-id"), what="the page to show the new task")
    assert by_id(browser, "task").is_displayed()
    return str(shown)


def row_text(browser: Chrome, task_id: str) -> str | None:
    """The text of the task's history row; None while it is not there or was redrawn while read (the page
    reloads the history when a watched task ends, replacing every row)."""
    try:
        rows = browser.find_elements(By.CSS_SELECTOR, f'#history tbody tr[data-task-id="{task_id}"]')
        return str(rows[0].text) if rows else None
    except StaleElementReferenceException:
        return None


def outcome(browser: Chrome) -> str:
    return str(until(browser, lambda b: by_id(b, "task").get_attribute("data-outcome"), what="an outcome"))


def test_partial_failure_shows_progress_the_failure_table_and_the_bill_guidance(page: Chrome, artifacts: Path) -> None:
    order = {"order_code": "SO-2041", "items": [
        {"item_code": "A-1", "quantity": 2, "warehouse": "main"},
        {"item_code": "B-7", "quantity": 0, "warehouse": "north"},
        {"item_code": "C-3", "quantity": 1, "bill_unpaid": True},
        {"item_code": "D-9", "quantity": 4, "warehouse": "north"},
    ]}
    submit(page, "orders.split", order)
    assert outcome(page) == "PARTIAL_FAILURE"
    assert by_id(page, "progress").get_attribute("value") == "100" and text(page, "percent") == "100%"
    assert (text(page, "succeeded"), text(page, "failed"), text(page, "total")) == ("2", "2", "4")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in by_id(page, "failures").find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert [(r[0], r[1]) for r in rows] == [("B-7", "10002"), ("C-3", "10001")]
    assert by_id(page, "guidance").is_displayed() and "Settle the bill" in text(page, "guidance")
    assert "error code 10001" in text(page, "outcome")
    assert by_id(page, "mode").get_attribute("data-mode") == "stream"
    assert "COMPLETED, 100%" in str(by_id(page, "live").get_attribute("textContent"))  # the aria-live region
    page.save_screenshot(str(artifacts / "page.png"))


def test_a_whole_task_10001_shows_the_guidance_and_other_codes_their_message(page: Chrome) -> None:
    submit(page, "orders.split", {"order_code": "SO-9", "account_status": "suspended",
                                  "items": [{"item_code": "A", "quantity": 1}]})
    assert outcome(page) == "FAILED"
    assert by_id(page, "guidance").is_displayed() and "code 10001" in text(page, "outcome")
    submit(page, "demo.sleep", {"seconds": 0, "fail_code": 20002})
    assert outcome(page) == "FAILED"
    assert "demo failure requested with code 20002" in text(page, "outcome")
    assert not by_id(page, "guidance").is_displayed()


def test_a_long_task_is_cancelled_from_the_page(page: Chrome, artifacts: Path) -> None:
    submit(page, "demo.sleep", {"seconds": 60, "steps": 600})
    until(page, lambda b: text(b, "status") == "PROCESSING" and int(b.find_element(By.ID, "progress")
                                                                     .get_attribute("value") or 0) > 0,
          what="the task to run and report progress")
    by_id(page, "cancel").click()
    assert outcome(page) == "CANCELLED"
    assert text(page, "status") == "CANCELLED" and text(page, "outcome") == "Cancelled."
    assert not by_id(page, "cancel").is_enabled()
    page.save_screenshot(str(artifacts / "cancelled.png"))


def test_when_the_event_stream_fails_polling_takes_over(page: Chrome, artifacts: Path) -> None:
    page.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events"]})
    submit(page, "demo.sleep", {"seconds": 2, "steps": 10, "items": 10, "fail_items": [3]})
    assert outcome(page) == "PARTIAL_FAILURE"
    assert by_id(page, "mode").get_attribute("data-mode") == "polling"
    assert text(page, "status") == "COMPLETED" and text(page, "percent") == "100%"
    assert int(text(page, "attempts") or 0) == 1
    assert not by_id(page, "resumed").is_displayed()  # resumed 0: nothing beside the attempts
    page.save_screenshot(str(artifacts / "polling.png"))


def test_a_resumed_task_shows_how_often_beside_its_attempts(page: Chrome, stack: Stack, artifacts: Path) -> None:
    """What the page shows of ``resumed`` (runs that continued from a checkpoint): the count is written into the
    record here, as a resume would (a real one: tests/integration), and the page polls it (the stream only
    speaks on a write the task's run makes)."""
    page.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events"]})
    task_id = submit(page, "demo.sleep", {"seconds": 60, "steps": 600})
    until(page, lambda b: text(b, "status") == "PROCESSING", what="the task to run")
    assert not by_id(page, "resumed").is_displayed()
    stack.redis().hset(keys.task(task_id), keys.TaskField.RESUMED, 2)
    until(page, lambda b: by_id(b, "resumed").is_displayed() and text(b, "resumed") == "resumed 2",
          what="resumed 2 beside the attempts")
    assert int(text(page, "attempts") or 0) == 1
    page.save_screenshot(str(artifacts / "resumed.png"))
    with Client(stack.base_url) as client:
        client.cancel(task_id)


def test_the_attempt_limit_ends_in_still_running_check_the_history_later(page: Chrome, stack: Stack) -> None:
    page.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events"]})
    task_id = submit(page, "demo.sleep", {"seconds": 60, "steps": 60}, max_attempts=2)
    assert outcome(page) == "STILL_RUNNING"
    assert text(page, "outcome") == "Still running — check the history later."
    assert not by_id(page, "notice").is_displayed()  # not an error
    with Client(stack.base_url) as client:
        client.cancel(task_id)


def test_a_rejected_payload_names_the_field(page: Chrome) -> None:
    Select(by_id(page, "task-type")).select_by_value("orders.split")
    box = by_id(page, "payload")
    box.clear()
    box.send_keys(json.dumps({"order_code": "SO-1", "items": [{"item_code": "A", "quantity": "many"}]}))
    by_id(page, "submit").click()
    notice = until(page, lambda b: by_id(b, "notice").is_displayed() and by_id(b, "notice"), what="the notice")
    assert "422" in notice.text and "payload.items.0.quantity" in notice.text


def test_the_history_pages_and_opens_a_task(page: Chrome, stack: Stack) -> None:
    with Client(stack.base_url) as client:
        for i in range(12):
            client.submit("orders.split", {"order_code": f"H-{uuid.uuid4().hex[:6]}-{i}",
                                           "items": [{"item_code": "A", "quantity": 1}]})
    by_id(page, "history-refresh").click()
    first_rows = until(page, lambda b: len(b.find_elements(By.CSS_SELECTOR, "#history tbody tr")) == 10 and
                       [r.text for r in b.find_elements(By.CSS_SELECTOR, "#history tbody tr")], what="page 1")
    by_id(page, "history-next").click()
    until(page, lambda b: text(b, "history-page") == "page 2", what="page 2")
    second = [r.text for r in page.find_elements(By.CSS_SELECTOR, "#history tbody tr")]
    assert second and not set(second) & set(first_rows)
    by_id(page, "history-prev").click()
    until(page, lambda b: text(b, "history-page") == "page 1" and not by_id(b, "history-prev").is_enabled(),
          what="back on page 1")
    page.find_element(By.CSS_SELECTOR, "#history tbody tr button").click()
    assert outcome(page) in ("COMPLETED", "PARTIAL_FAILURE", "FAILED", "CANCELLED", "STILL_RUNNING")


def docs_snippet() -> str:
    """The JS snippet of docs/clients.md, as an async function body (its static import made dynamic)."""
    text = (REPO_ROOT / "docs" / "clients.md").read_text()
    block = text.split("<!-- snippet:js -->")[1].split("<!-- /snippet:js -->")[0]
    code = block.split("```js")[1].split("```")[0]
    statement = 'import { submitTask, watchTask } from "/static/taskport.mjs";'
    assert statement in code
    return code.replace(statement, 'const { submitTask, watchTask } = await import("/static/taskport.mjs");')


def test_the_docs_js_snippet_runs_as_written(page: Chrome) -> None:
    calls = page.execute_async_script(
        "const finish = arguments[arguments.length - 1]; const calls = [];"
        "const record = (name) => (...args) => calls.push([name, ...args.map((a) => JSON.stringify(a))]);"
        "const [showProgress, showBillUnpaidDialog, showFailures, showResult, showError, showNotice] ="
        " ['progress', 'bill', 'failures', 'result', 'error', 'notice'].map(record);"
        "const console = { log: record('log') };"
        "(async () => {" + docs_snippet() + "})().then(() => finish(calls), (e) => finish([['thrown', String(e)]]));")
    names = [c[0] for c in calls]
    assert "thrown" not in names and names[-1] == "log", calls
    assert calls[-1][1] == '"PARTIAL_FAILURE"'
    assert "bill" in names and "failures" in names and "result" in names and "progress" in names


def test_the_client_works_from_a_script_tag_and_as_a_module_and_no_operator_link(page: Chrome) -> None:
    assert page.execute_script("return typeof window.taskport.watchTask") == "function"
    same = page.execute_async_script(
        "const done = arguments[0];"
        "import('/static/taskport.mjs').then((m) => done(m.watchTask === window.taskport.watchTask"
        " && m.default === window.taskport), (e) => done(String(e)));")
    assert same is True
    assert page.find_elements(By.ID, "ops-link") == []  # the dashboard is off in this stack
    problem = page.execute_async_script(
        "const done = arguments[0];"
        "window.taskport.getResult('00000000-0000-4000-8000-000000000000')"
        ".then(() => done('resolved'), (e) => done([e.name, e.status, e.detail]));")
    assert problem == ["TaskportError", 404, "task not found or expired"]


def test_a_file_result_gets_a_download_link(page: Chrome) -> None:
    task_id = submit(page, "orders.export", {"rows": 25, "format": "csv"})
    assert outcome(page) == "COMPLETED"
    link = until(page, lambda b: by_id(b, "download").is_displayed() and by_id(b, "download"), what="the link")
    assert str(link.get_attribute("href")).endswith(f"/api/v1/tasks/{task_id}/result/file")
    assert link.text.startswith("Download orders_") and link.get_attribute("download")
    size = page.execute_async_script(
        "const done = arguments[0]; fetch(document.getElementById('download').href)"
        ".then((r) => r.text()).then((t) => done(t.trim().split('\\n').length));")
    assert size == 1 + 25


def test_with_an_api_key_the_page_still_streams(browser: Chrome, keyed_stack: Stack) -> None:
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    browser.get(keyed_stack.url("/"))
    until(browser, lambda b: len(Select(by_id(b, "task-type")).options) >= 3, what="task types to load")
    Select(by_id(browser, "task-type")).select_by_value("demo.sleep")
    by_id(browser, "submit").click()
    notice = until(browser, lambda b: by_id(b, "notice").is_displayed() and by_id(b, "notice"), what="the 401")
    assert "401" in notice.text and "needs an API key" in notice.text
    by_id(browser, "api-key").send_keys("k-browser")
    submit(browser, "demo.sleep", {"seconds": 1, "steps": 10})
    assert outcome(browser) == "COMPLETED"
    assert by_id(browser, "mode").get_attribute("data-mode") == "stream"  # fetch() sent the key on the stream
    assert len(browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")) >= 1  # acme's history


def test_a_dropped_stream_is_resumed_with_last_event_id(browser: Chrome, stack: Stack) -> None:
    proxy = DroppingProxy(stack.config.port)  # the page is loaded through a proxy whose connections we can cut
    try:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        browser.get(proxy.url + "/")
        until(browser, lambda b: len(Select(by_id(b, "task-type")).options) >= 3, what="task types to load")
        task_id = submit(browser, "demo.sleep", {"seconds": 4, "steps": 40})
        until(browser, lambda b: by_id(b, "mode").get_attribute("data-mode") == "stream" and
              int(by_id(b, "progress").get_attribute("value") or 0) > 0, what="the stream to show progress")
        assert proxy.drop() >= 1
        assert outcome(browser) == "COMPLETED"
    finally:
        proxy.close()
    assert by_id(browser, "mode").get_attribute("data-mode") == "stream"  # resumed, not degraded to polling
    streams = [r for r in proxy.requests if f"/tasks/{task_id}/events" in r]
    assert len(streams) >= 2 and "last-event-id" not in streams[0].lower()
    assert any(line.lower().startswith("last-event-id: ") for line in streams[1].split("\r\n")), streams[1]
