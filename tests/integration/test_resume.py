"""A restart loses no work, with real processes under ``taskport up``: Ctrl-C with a task running puts it back
on its queue from its checkpoint, and the next ``taskport up`` finishes it from there (attempts 1, resumed 1);
a SIGTERM to one worker under load (a dyno restart) puts its task back and the other workers finish it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import requests

from tests.integration.harness import Up, started, wait_until

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

TASKS = "/api/v1/tasks"
ITEMS, ITEM_SECONDS = 40, 0.25  # the task: 10 s of items


def submit(up: Up, **payload: Any) -> str:
    r = requests.post(up.base_url + TASKS, json={"type": "demo.sleep", "payload": payload}, timeout=10)
    assert r.status_code == 202, r.text
    return str(r.json()["task_id"])


def status(up: Up, task_id: str) -> dict[str, Any]:
    r = requests.get(f"{up.base_url}{TASKS}/{task_id}", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def items_done(doc: dict[str, Any]) -> int:
    items = doc["items"] or {"succeeded": 0, "failed": 0}
    return int(items["succeeded"] + items["failed"])


def ended(up: Up, task_id: str, timeout: float) -> dict[str, Any]:
    return wait_until(lambda: (doc := status(up, task_id))["status"] not in ("PENDING", "PROCESSING") and doc,
                      timeout=timeout, ignore=(requests.RequestException,),
                      message=lambda: f"task {task_id} to end:\n{up.tail()}")


def stopped(up: Up, sig: int) -> None:
    """``sig`` to ``taskport up``'s process group, as a terminal's Ctrl-C (SIGINT) or make's forwarding does,
    and wait for it to exit."""
    os.killpg(up.popen.pid, sig)
    up.popen.wait(timeout=40)


def test_ctrl_c_with_a_task_running_loses_nothing_and_the_next_start_resumes_it(
        up_factory: Callable[..., Up]) -> None:
    """SIGINT to the group, as a terminal's Ctrl-C (SIGTERM takes the same handler: test_stop_signals.py)."""
    up = started(up_factory, {})
    task_id = submit(up, items=ITEMS, item_seconds=ITEM_SECONDS)
    wait_until(lambda: items_done(status(up, task_id)) >= ITEMS // 2, timeout=30, message="half the items")
    stopped(up, signal.SIGINT)
    assert "put back on queue default" in up.output() and "FAILED" not in up.output()

    again = Up(up.workdir)  # the same data dir: `make up` again
    up_factory.runs.append(again)  # type: ignore[attr-defined]
    again.wait_for("taskport is up: http://127.0.0.1:")
    up_at = time.time()  # the workers may have resumed it (or even finished it) before the web was up
    done = ended(again, task_id, timeout=30)
    assert done["status"] == "COMPLETED", done
    assert (done["attempts"], done["resumed"]) == (1, 1)
    assert done["items"]["total"] == ITEMS and items_done(done) == ITEMS
    # the resumed run's start: its "started" log line (started_at keeps the first run's start, docs/api.md)
    line = next(line for line in again.output().splitlines() if f"task_id={task_id} started " in line)
    began = datetime.fromisoformat(line.split()[0]).timestamp()
    completed = datetime.fromisoformat(done["completed_at"]).timestamp()
    assert datetime.fromisoformat(done["started_at"]).timestamp() < up_at - 1  # the first run's start, kept
    assert began < up_at + 5, (began - up_at, again.tail())
    # the resumed run did the remaining half, not all 10 s again
    assert completed - began < ITEMS * ITEM_SECONDS * 0.75, (began, completed)
    print(f"resumed: the second run started {began - up_at:+.1f} s from `taskport is up` and took "
          f"{completed - began:.1f} s")


def test_a_sigterm_to_one_worker_under_load_puts_its_task_back_and_the_others_finish_it(
        up_factory: Callable[..., Up]) -> None:
    up = started(up_factory, {"TASKPORT_WORKERS": "3"})
    tasks = [submit(up, items=12, item_seconds=0.5, steps=n) for n in (1, 2, 3)]  # three distinct tasks
    # every run past its first item, so inside its heartbeat: a stop that lands between a run's START and its
    # heartbeat is a warm stop (the run goes on to its end, workers.stopping), which CI once hit when this
    # waited for PROCESSING alone
    wait_until(lambda: all((doc := status(up, t))["status"] == "PROCESSING" and items_done(doc) >= 1 for t in tasks),
               timeout=20, message="every task running, an item done")
    victim = up.pid("worker.1")
    os.kill(victim, signal.SIGTERM)  # a dyno restart: the platform stops one process
    outcomes = [ended(up, t, timeout=60) for t in tasks]
    assert [d["status"] for d in outcomes] == ["COMPLETED"] * 3, outcomes
    assert all(d["attempts"] == 1 and items_done(d) == 12 for d in outcomes), outcomes
    assert sum(d["resumed"] for d in outcomes) == 1, outcomes  # the stopped worker's task, once
    assert "put back on queue default" in up.output()
