"""Cancel with real processes: a queued task never starts; a running one stops, its worker is free for the
next task within about a second, and nothing it would write afterwards is kept."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.integration.harness import TASKS, Api, Stack, wait_until

FREED_WITHIN = 2.5  # seconds from DELETE until the same single worker has completed a new task


def quick(api: Api) -> str:
    """A new task that completes at once (unique, so never a duplicate)."""
    return api.create("demo.sleep", {"steps": 1}, dedup_key=uuid.uuid4().hex)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_a_cancelled_pending_task_never_starts(stack: Stack, api: Api) -> None:
    cancelled = api.create("demo.sleep", {"seconds": 0.1})
    response = api.delete(f"{TASKS}/{cancelled}")
    assert response.status_code == 204, response.text
    doc = api.status(cancelled)
    assert doc["status"] == "CANCELLED" and doc["completed_at"] and doc["started_at"] is None

    [worker] = stack.start_worker()
    after = quick(api)  # queued behind the cancelled one: once it is done, the worker has passed it
    api.wait_for(after, "COMPLETED")
    assert api.status(cancelled) == doc
    assert doc["attempts"] == 0
    assert cancelled not in worker.log(), "the cancelled task's job was still delivered to the worker"


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
@pytest.mark.parametrize("worker_class", ["fork", "simple"])
def test_cancelling_a_running_task_frees_its_worker_and_keeps_nothing_later(
    stack: Stack, api: Api, worker_class: str
) -> None:
    stack.configure(worker_class=worker_class)
    stack.start_worker()
    running = api.create("demo.sleep", {"seconds": 30, "steps": 300})
    wait_until(lambda: (d := api.status(running))["status"] == "PROCESSING" and d["progress"] > 0,
               message="the sleep to be running with progress")

    started = time.monotonic()
    assert api.delete(f"{TASKS}/{running}").status_code == 204
    at_cancel = api.status(running)
    assert at_cancel["status"] == "CANCELLED" and at_cancel["completed_at"]

    after = quick(api)
    api.wait_for(after, "COMPLETED", timeout=10)
    freed = time.monotonic() - started
    assert freed < FREED_WITHIN, f"the {worker_class} worker took {freed:.2f} s to be free again"
    assert api.status(running) == at_cancel  # no progress, message or time written after the cancel
    result = api.get(f"{TASKS}/{running}/result")
    assert result.status_code == 409 and result.json()["task_status"] == "CANCELLED"


@pytest.mark.parametrize("worker_class", ["fork", "simple"])
def test_an_export_cancelled_midway_leaves_no_file(stack: Stack, api: Api, worker_class: str) -> None:
    stack.configure(worker_class=worker_class)
    stack.start_worker()
    results = Path(stack.config.results_dir)
    export = api.create("orders.export", {"rows": 1_000_000, "format": "csv"})
    wait_until(lambda: (d := api.status(export))["status"] == "PROCESSING" and d["progress"] > 0,
               message="the export to be writing rows")
    assert files_under(results), "the export writes as it goes: a partial file should exist by now"

    assert api.delete(f"{TASKS}/{export}").status_code == 204
    api.wait_for(quick(api), "COMPLETED")  # the worker is done with the export
    assert files_under(results) == []
    assert api.status(export)["status"] == "CANCELLED"
