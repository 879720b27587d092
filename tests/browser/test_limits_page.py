"""What the page shows of a task parked by a concurrency limit (issue 31): its reason, as text, in the task view
and in the history line, never a task link made of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from taskport import Client
from tests.browser.test_page import by_id, page, submit, text, until
from tests.integration.harness import Stack, started_stack

__all__ = ["page"]  # the fixture, shared with the page's other tests
REASON = "concurrency: demo.sleep member public 1/1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("browser-limits"), concurrency="demo.sleep=1/member") as s:
        s.start_worker()  # a second worker: it takes the second task and parks it
        yield s


def test_a_parked_task_shows_why_it_waits(page: Chrome, stack: Stack) -> None:
    with Client(stack.base_url) as client:
        running = client.submit("demo.sleep", {"seconds": 60, "steps": 60})["task_id"]
        parked = submit(page, "demo.sleep", {"seconds": 0, "steps": 1})
        until(page, lambda b: text(b, "status") == "PENDING" and REASON in text(b, "waiting-for"),
              what="the reason in the task view")
        assert not by_id(page, "waiting-for").find_elements(By.TAG_NAME, "button")  # no task link made of it
        by_id(page, "history-refresh").click()
        until(page, history_says_why, what="the reason in the history line")
        for task_id in (running, parked):
            client.cancel(task_id)


def history_says_why(browser: Chrome) -> bool:
    """Whether a history row shows the reason; False to look again (none yet, or the rows were redrawn)."""
    try:
        return any(REASON in row.text for row in browser.find_elements(By.CSS_SELECTOR, "#history tbody tr"))
    except StaleElementReferenceException:
        return False
