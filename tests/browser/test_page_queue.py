"""The page at / shows a waiting task's place in line (issue 31), in headless Chromium against the real stack (one
worker: a long task holds it, two more wait before the page's)."""

from __future__ import annotations

import uuid
from pathlib import Path

from selenium.webdriver import Chrome

from taskport import Client
from tests.browser.test_page import by_id, outcome, page, row_text, submit, text, until
from tests.integration.harness import Stack, wait_until

__all__ = ["page"]  # the fixture, shared with the page's other tests

FILLER_SECONDS = 7  # longer than the JS client's 5 s refresh of the place: each place is seen


def test_a_queued_task_shows_its_place_which_falls_as_tasks_ahead_start(
        page: Chrome, stack: Stack, artifacts: Path) -> None:
    with Client(stack.base_url) as client:
        blocker = client.submit("demo.sleep", {"seconds": 120, "steps": 120}, idempotency_key=uuid.uuid4().hex)
        wait_until(lambda: client.status(blocker["task_id"])["status"] == "PROCESSING", 30,
                   message="the worker to be busy")
        fillers = [client.submit("demo.sleep", {"seconds": FILLER_SECONDS, "steps": 7},
                                 idempotency_key=uuid.uuid4().hex) for _ in range(2)]
        try:
            task_id = submit(page, "demo.sleep", {"seconds": 0})
            until(page, lambda b: text(b, "status") == "PENDING" and text(b, "queue-place").startswith("2 tasks ahead"),
                  what="its place: the two fillers before it")
            assert by_id(page, "waiting").is_displayed()
            page.save_screenshot(str(artifacts / "queued.png"))
            client.cancel(blocker["task_id"])  # the fillers start, one after the other
            until(page, lambda b: text(b, "queue-place").startswith("1 task ahead"), FILLER_SECONDS + 10,
                  "one filler started: one ahead")
            until(page, lambda b: text(b, "queue-place").startswith("next in line"), FILLER_SECONDS + 10,
                  "both started: next in line")
            assert outcome(page) == "COMPLETED"
            assert not by_id(page, "waiting").is_displayed() and text(page, "queue-place") == ""
            until(page, lambda b: "COMPLETED" in (row_text(b, task_id) or ""), what="its history row COMPLETED")
        finally:
            for task in (blocker, *fillers):
                if client.status(task["task_id"])["status"] in ("PENDING", "PROCESSING"):
                    client.cancel(task["task_id"])
