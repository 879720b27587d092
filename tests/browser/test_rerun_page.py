"""The page's "Run again": shown for a FAILED (or CANCELLED) task only; it runs the same task again and the
page watches it anew."""

from __future__ import annotations

from selenium.webdriver import Chrome

from tests.browser.test_page import by_id, outcome, page, submit, text, until

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
