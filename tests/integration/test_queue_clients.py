"""The CLI's and the Python client's view of a waiting task's place in line (issue 31) against the real stack: one
worker, held by a long task, and tasks waiting behind it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from taskport import Client, StillRunning
from taskport import cli as tcli
from tests.integration.harness import Stack, started_stack, wait_until
from tests.integration.test_clients import run_cli


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("queue-clients")) as s:
        yield s


def test_status_watch_and_follow_say_how_many_tasks_are_ahead(stack: Stack) -> None:
    with Client(stack.base_url) as client:
        blocker = client.submit("demo.sleep", {"seconds": 120, "steps": 120}, idempotency_key=uuid.uuid4().hex)
        wait_until(lambda: client.status(blocker["task_id"])["status"] == "PROCESSING", 30,
                   message="the worker to be busy")
        waiting = [client.submit("demo.sleep", {"seconds": 0}, idempotency_key=uuid.uuid4().hex) for _ in range(3)]
        last = waiting[-1]["task_id"]
        try:
            shown = run_cli(stack.base_url, "status", last)
            assert shown.returncode == tcli.STILL_RUNNING, shown.stderr
            assert re.search(r"^queue +2 ahead(, starts ~\d\d:\d\d:\d\d)?$", shown.stdout, re.M), shown.stdout
            watched = run_cli(stack.base_url, "watch", last, "--timeout", "1")
            assert watched.returncode == tcli.STILL_RUNNING
            assert re.search(r"^PENDING .*queued: 2 ahead", watched.stderr, re.M), watched.stderr
            with pytest.raises(StillRunning) as still:
                for doc in client.follow(last, timeout=1):
                    assert doc["status"] == "PENDING" and doc["queue"]["position"] == 2
            assert still.value.doc is not None and still.value.doc["queue"]["position"] == 2
        finally:
            for task in (*reversed(waiting), blocker):  # the queued first: behind the blocker they cannot end
                if client.status(task["task_id"])["status"] in ("PENDING", "PROCESSING"):
                    client.cancel(task["task_id"])
