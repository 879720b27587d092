"""The page's "Run again": shown for a FAILED (or CANCELLED) task only; it runs the same task again and the
page watches it anew. And what the page shows of a PENDING task that waits for its time ("runs at")."""

from __future__ import annotations

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from taskport import Client
from tests.browser.test_page import by_id, outcome, page, submit, text, until
from tests.integration.harness import Stack

__all__ = ["page"]  # the fixture, shared with the page's other tests


def test_a_failed_task_runs_again_from_the_page(page: Chrome) -> None:
    task_id = submit(page, "demo.sleep", {"seconds": 0, "fail_code": 20002})
    assert outcome(page) == "FAILED" and text(page, "attempts") == "1"
    assert by_id(page, "rerun").is_displayed() and by_id(page, "rerun").text == "Run again"
    by_id(page, "rerun").click()
    until(page, lambda b: text(b, "attempts") == "2" and by_id(b, "task").get_attribute("data-outcome") == "FAILED",
          what="the second run to fail too")
    assert by_id(page, "task").get_attribute("data-task-id") == task_id  # the same task
    submit(page, "demo.sleep", {"seconds": 0})
    assert outcome(page) == "COMPLETED" and not by_id(page, "rerun").is_displayed()


def test_a_delayed_task_shows_when_it_runs(page: Chrome, stack: Stack) -> None:
    """Submitted over HTTP with ``delay``, it is "runs at" in the history and in the task view; the form's
    "Delay (s)" sends ``delay`` too."""
    with Client(stack.base_url) as client:
        task_id = client.submit("demo.sleep", {"seconds": 0}, delay=30)["task_id"]
        by_id(page, "history-refresh").click()
        until(page, open_waiting_row, what="runs at in the history")
        until(page, lambda b: by_id(b, "task").get_attribute("data-task-id") == task_id and
              text(b, "runs-at").startswith("runs at "), what="runs at in the task view")
        by_id(page, "delay").send_keys("30")
        formed = submit(page, "demo.sleep", {"seconds": 0})
        until(page, lambda b: text(b, "status") == "PENDING" and text(b, "runs-at").startswith("runs at "),
              what="runs at for the form's delay")
        for done in (task_id, formed):
            client.cancel(done)


def open_waiting_row(browser: Chrome) -> bool:
    """Click the history row that says "runs at"; False to try again (none yet, or the rows were redrawn)."""
    try:
        for row in browser.find_elements(By.CSS_SELECTOR, "#history tbody tr"):
            if "runs at" in row.text:
                row.find_element(By.TAG_NAME, "button").click()
                return True
    except StaleElementReferenceException:
        pass
    return False
