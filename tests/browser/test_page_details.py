"""What a person notices on the page (issue 22, section 4): nothing shown that does not apply, a history row that
follows the task being watched, times in the reader's own zone with how long ago, a notice that goes once it is
no longer true, the type of a reopened task, and an icon instead of a 404 in the console."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from taskport import Client, Conflict
from tests.browser.test_page import by_id, outcome, page, submit, text, until
from tests.integration.harness import Stack

__all__ = ["page"]  # the fixture, shared with the page's other tests

ZONE = "Asia/Kolkata"  # +05:30 all year: never the machine's UTC, and no daylight saving to trip on
AGO = re.compile(r"\((\d+) s ago\)")


def history_row(browser: Chrome, task_id: str) -> list[str] | None:
    """The cells of the task's history row (its id button first), or None while it is not there."""
    try:
        for row in browser.find_elements(By.CSS_SELECTOR, "#history tbody tr"):
            buttons = row.find_elements(By.TAG_NAME, "button")
            if buttons and buttons[0].get_attribute("aria-label") == f"watch task {task_id}":
                return [str(td.text) for td in row.find_elements(By.TAG_NAME, "td")]
    except StaleElementReferenceException:  # redrawn while read: read again
        pass
    return None


@contextlib.contextmanager
def cancelled_at_the_end(stack: Stack, task_id: str) -> Iterator[None]:
    """Cancel the task however the test ends (the stack has one worker: a 60 s task left running blocks the
    tests after it)."""
    try:
        yield
    finally:
        with Client(stack.base_url) as client, contextlib.suppress(Conflict):
            client.cancel(task_id)


def test_a_task_without_items_shows_no_item_counts(page: Chrome) -> None:
    submit(page, "demo.sleep", {"seconds": 0})
    assert outcome(page) == "COMPLETED"
    assert not by_id(page, "items").is_displayed() and not by_id(page, "items-term").is_displayed()
    assert "0 succeeded" not in str(by_id(page, "task").text)
    submit(page, "demo.sleep", {"seconds": 0, "items": 3, "fail_items": [2]})
    assert outcome(page) == "PARTIAL_FAILURE"
    assert by_id(page, "items").is_displayed() and text(page, "items") == "2 succeeded, 1 failed of 3"


def test_the_history_row_follows_the_watched_task(page: Chrome, stack: Stack) -> None:
    task_id = submit(page, "demo.sleep", {"seconds": 60, "steps": 600})
    with cancelled_at_the_end(stack, task_id):
        until(page, lambda b: int(by_id(b, "progress").get_attribute("value") or 0) >= 2, what="the panel at 2 %")

        def row_matches_panel(b: Chrome) -> bool:
            row = history_row(b, task_id)
            return row is not None and row[2] == text(b, "status") == "PROCESSING" and row[3] == text(b, "percent")

        until(page, row_matches_panel, what="the history row at the panel's status and progress")
        with Client(stack.base_url) as client:
            client.cancel(task_id)
        assert outcome(page) == "CANCELLED"
        until(page, lambda b: (history_row(b, task_id) or [""] * 3)[2] == "CANCELLED", what="the row CANCELLED too")


def test_times_are_local_with_how_long_ago_and_the_exact_value_on_hover(page: Chrome, stack: Stack) -> None:
    page.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ZONE})
    page.execute_cdp_cmd("Emulation.setLocaleOverride", {"locale": "en-GB"})
    try:
        task_id = submit(page, "demo.sleep", {"seconds": 0})
        assert outcome(page) == "COMPLETED"
        with Client(stack.base_url) as client:
            created = client.status(task_id)["created_at"]
        local = datetime.fromisoformat(created.replace("Z", "+00:00")).astimezone(ZoneInfo(ZONE))
        shown: WebElement = by_id(page, "created").find_element(By.TAG_NAME, "time")
        assert shown.get_attribute("title") == created and shown.get_attribute("datetime") == created
        assert local.strftime("%H:%M:%S") in shown.text and created not in shown.text, shown.text
        assert AGO.search(shown.text), shown.text
        by_id(page, "history-refresh").click()
        until(page, lambda b: (history_row(b, task_id) or [""] * 5)[4].startswith(f"{local.day} {local:%b}"),
              what="the history's created column in local time")
        cell = page.find_element(By.CSS_SELECTOR, f'#history time[datetime="{created}"]')
        assert cell.get_attribute("title") == created
        # "how long ago" keeps counting while the page stays open
        until(page, lambda b: int(AGO.search(by_id(b, "created").text).group(1)) >= 2,  # type: ignore[union-attr]
              what="the panel's 'ago' to count on")
    finally:
        page.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
        page.execute_cdp_cmd("Emulation.setLocaleOverride", {})


def test_cancellation_requested_goes_once_the_task_is_cancelled(page: Chrome, stack: Stack) -> None:
    task_id = submit(page, "demo.sleep", {"seconds": 60, "steps": 600})
    with cancelled_at_the_end(stack, task_id):
        until(page, lambda b: text(b, "status") == "PROCESSING", what="the task to run")
        by_id(page, "cancel").click()
        assert outcome(page) == "CANCELLED"
    until(page, lambda b: not by_id(b, "notice").is_displayed(), what="the notice to go")
    assert "Cancellation requested." not in str(by_id(page, "notice").get_attribute("textContent"))
    assert text(page, "outcome") == "Cancelled."


def test_a_reopened_task_shows_its_type(page: Chrome, stack: Stack) -> None:
    with Client(stack.base_url) as client:
        earlier = client.submit("orders.split", {"order_code": f"T-{uuid.uuid4().hex[:8]}",
                                                 "items": [{"item_code": "A", "quantity": 1}]})["task_id"]
        client.wait(earlier, timeout=20)
    submit(page, "demo.sleep", {"seconds": 0})
    assert outcome(page) == "COMPLETED" and text(page, "type") == "demo.sleep"
    assert Select(by_id(page, "task-type")).first_selected_option.text == "demo.sleep"
    by_id(page, "history-refresh").click()

    def open_earlier(b: Chrome) -> bool:
        try:
            b.find_element(By.CSS_SELECTOR, f'#history button[aria-label="watch task {earlier}"]').click()
            return True
        except Exception:  # not drawn yet, or redrawn while clicked
            return False

    until(page, open_earlier, what="the earlier task in the history")
    until(page, lambda b: by_id(b, "task").get_attribute("data-task-id") == earlier, what="the earlier task")
    assert text(page, "type") == "orders.split"


def test_the_page_has_an_icon_and_loads_without_a_console_error(page: Chrome, stack: Stack) -> None:
    page.get_log("browser")  # drop what earlier tests left
    page.get(stack.url("/"))
    until(page, lambda b: len(Select(by_id(b, "task-type")).options) >= 3, what="task types to load")
    icon = page.find_element(By.CSS_SELECTOR, 'link[rel~="icon"]').get_attribute("href")
    answer = page.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then((r) => done([r.status, r.headers.get('Content-Type')]), (e) => done(String(e)));",
        icon)
    assert answer[0] == 200 and answer[1].startswith("image/svg+xml"), answer
    errors = [entry for entry in page.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
