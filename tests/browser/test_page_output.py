"""The page at / shows the watched task's output lines (issue 30), in headless Chromium against the real stack."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from taskport import Client
from tests.browser.test_page import outcome, page, submit, text, until
from tests.integration.harness import Stack

__all__ = ["page"]  # the fixture, shared with the page's other tests


def shown_lines(browser: Chrome) -> list[str]:
    return [str(li.get_attribute("textContent")) for li in browser.find_elements(By.CSS_SELECTOR, "#output li")]


def server_lines(stack: Stack, task_id: str) -> list[str]:
    with Client(stack.base_url) as client:
        texts, after = [], None
        while True:
            got = client.output(task_id, after)
            texts += [line["text"] for line in got["lines"]]
            if got["next"] is None or not got["lines"]:
                return texts
            after = got["next"]


def test_the_page_shows_the_output_lines_of_the_task_it_watches(page: Chrome, stack: Stack, artifacts: Path) -> None:
    task_id = submit(page, "demo.sleep", {"seconds": 2, "steps": 8, "output": True})
    assert outcome(page) == "COMPLETED"
    expected = server_lines(stack, task_id)
    until(page, lambda b: shown_lines(b) == expected, what="every output line, in order")
    assert len(expected) >= 8 and text(page, "output-count") == f"({len(expected)} lines)"
    page.save_screenshot(str(artifacts / "output.png"))
    submit(page, "demo.sleep", {"seconds": 0})  # another task: the list starts again, hidden while it has none
    until(page, lambda b: not shown_lines(b) and not b.find_element(By.ID, "output-box").is_displayed(),
          what="the list emptied for the next task")


def test_the_page_keeps_the_newest_500_lines(page: Chrome, stack: Stack) -> None:
    task_id = submit(page, "demo.sleep", {"seconds": 1, "steps": 700, "output": True})
    assert outcome(page) == "COMPLETED"
    expected = server_lines(stack, task_id)
    assert len(expected) >= 700
    until(page, lambda b: shown_lines(b) == expected[-500:], what="the newest 500 lines")
    assert text(page, "output-count") == f"(the last 500 of {len(expected)} lines)"
    at_end = page.execute_script("const l = document.getElementById('output');"
                                 "return l.scrollHeight - l.scrollTop - l.clientHeight < 8;")
    assert at_end is True  # it followed the newest line
