"""A crash resumes too, with real processes under ``taskport up`` and the default stall timeout (30 s), which
none of these waits for: the worker supervisor starts in a dead worker's slot (the same RQ name) recovers its
run at once, from its checkpoint and without using an attempt, and removes the dead worker from RQ.

- ``kill -9`` of the worker running a task at about item 20 of 40: running again within seconds, it
  completes with attempts 1 and resumed 1;
- ``kill -9`` of every process of ``taskport up`` (Redis too: its AOF, fsync everysec), then ``taskport up``
  again on the same data dir: running again within 5 s of the new start, completed the same way;
- after each, RQ (``rq info``: ``Worker.all``) and ``/readyz`` count only the live workers;
- a processor that kills its own process at the same item every time ends FAILED -3 after one free
  resumption (its checkpoint advanced once), in two runs: no endless loop.

The times are printed (``pytest -s``) and recorded in docs/self-healing.md.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import requests
from rq import Worker

from app.core import audit, keys
from app.core.config import Config
from app.core.process import alive, session_members
from app.launch.supervisorconf import worker_slot_name
from tests.integration.harness import Up, running_workers, started, task_workers, wait_until
from tests.integration.test_resume import ITEM_SECONDS, ITEMS, ended, items_done, status, submit

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

STALL_TIMEOUT = 30.0  # the default: a recovery that waited for it would take longer than every bound here
POISON_ENV = {"TASKPORT_PROCESSORS": "tests.userprocs.poison"}


def redis_of(up: Up) -> redis.Redis:
    return redis.Redis.from_url(up.redis_url(), socket_timeout=5)


def running_again(up: Up, task_id: str) -> bool:
    """The task runs again, in a run that resumed from the checkpoint (read in Redis: the web may still start)."""
    conn = redis_of(up)
    try:
        status_, resumed = conn.hmget(keys.task(task_id), ["status", "resumed"])
    except redis.RedisError:
        return False
    finally:
        conn.close()
    return status_ == b"PROCESSING" and resumed == b"1"


def worker_pid(up: Up, task_id: str) -> int:
    """The pid of the worker whose registration in RQ names the task's job as its current one."""
    conn = redis_of(up)
    try:
        return int(wait_until(lambda: [w.pid for w in running_workers(conn, task_id)],
                              message=f"a worker to report {task_id} as its job")[0])
    finally:
        conn.close()


def only_live_workers_counted(up: Up) -> None:
    """RQ lists exactly the supervised workers, one per slot, every one alive; /readyz counts as many."""
    config = Config.from_env({}, data_dir=up.data_dir)
    slots = {worker_slot_name(config, str(n)) for n in range(1, up.workers + 1)}
    conn = redis_of(up)
    try:
        def listed() -> dict[str, int] | None:
            workers = {w.name: int(w.pid or 0) for w in task_workers(conn)}
            return workers if set(workers) == slots and all(map(alive, workers.values())) else None

        workers = wait_until(listed, timeout=10, message=lambda: f"only the live workers in RQ: "
                             f"{[(w.name, w.pid) for w in Worker.all(connection=conn)]}")
        assert sorted(workers.values()) == sorted(p for n, p in up.child_pids().items() if n.startswith("worker"))
    finally:
        conn.close()
    counts = requests.get(up.base_url + "/readyz", timeout=10).json()["workers"]
    assert counts == {"high": up.workers, "default": up.workers, "low": up.workers}, counts


def completed_from_the_checkpoint(up: Up, task_id: str, items: int = ITEMS) -> dict[str, Any]:
    done = ended(up, task_id, timeout=30)
    assert done["status"] == "COMPLETED", done
    assert (done["attempts"], done["resumed"]) == (1, 1), done
    assert done["items"]["total"] == items and items_done(done) == items, done
    return done


def test_kill9_of_the_worker_running_a_task_resumes_it_at_once(up_factory: Callable[..., Up]) -> None:
    up = started(up_factory, {})
    task_id = submit(up, items=ITEMS, item_seconds=ITEM_SECONDS)
    wait_until(lambda: items_done(status(up, task_id)) >= ITEMS // 2, timeout=30, message="half the items")
    os.kill(worker_pid(up, task_id), signal.SIGKILL)  # the OOM killer's way: the worker process alone
    killed = time.monotonic()
    wait_until(lambda: running_again(up, task_id), timeout=STALL_TIMEOUT / 2, interval=0.05,
               message=lambda: f"the task to run again:\n{up.tail()}")
    running_after = time.monotonic() - killed
    completed_from_the_checkpoint(up, task_id)
    finished_after = time.monotonic() - killed
    [line] = [x for x in up.output().splitlines() if "replaced its dead predecessor" in x]
    assert f"task_id={task_id}" in line and "from its checkpoint, no attempt used" in line, line
    only_live_workers_counted(up)
    print(f"\nkill -9 of the worker: PROCESSING again {running_after:.2f} s after the kill, "
          f"COMPLETED {finished_after:.2f} s after it")


def kill9_everything(up: Up) -> None:
    """Every process of the run at once: frozen first (SIGSTOP), so none hears of another's death and starts
    an orderly stop (supervisord would, on its parent's), then SIGKILL; as a machine that loses power."""
    supervisord = up.supervisord_pid()
    pids = [up.popen.pid, supervisord, *session_members(supervisord)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            os.kill(pid, sig)
    up.popen.wait(timeout=10)
    wait_until(lambda: not any(map(alive, pids)), timeout=10, message="every process of the run to be gone")


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
def test_kill9_of_everything_then_up_again_resumes_the_task_within_5_s(up_factory: Callable[..., Up]) -> None:
    up = started(up_factory, {})
    task_id = submit(up, items=ITEMS, item_seconds=ITEM_SECONDS)
    wait_until(lambda: items_done(status(up, task_id)) >= ITEMS // 2, timeout=30, message="half the items")
    kill9_everything(up)
    again = Up(up.workdir)  # the same data dir: `taskport up` again
    up_factory.runs.append(again)  # type: ignore[attr-defined]
    begun = time.monotonic()
    again.wait_for("embedded Redis (pid")
    wait_until(lambda: running_again(again, task_id), timeout=5, interval=0.05,
               message=lambda: f"the task to run again within 5 s:\n{again.tail()}")
    running_after = time.monotonic() - begun
    again.wait_for("taskport is up: http://127.0.0.1:")
    completed_from_the_checkpoint(again, task_id)
    finished_after = time.monotonic() - begun
    only_live_workers_counted(again)
    conn = redis_of(again)
    try:
        housekeepers = [w.queue_names() for w in Worker.all(connection=conn) if w not in task_workers(conn)]
    finally:
        conn.close()
    print(f"\nkill -9 of everything, up again: PROCESSING {running_after:.2f} s after the new start, "
          f"COMPLETED after {finished_after:.2f} s; rq info also lists {len(housekeepers)} housekeepers "
          f"(the scheduler's, old and new): {housekeepers}")


def test_a_processor_that_kills_its_process_at_the_same_item_every_time_ends_failed_minus_3(
        up_factory: Callable[..., Up]) -> None:
    up = started(up_factory, POISON_ENV)
    r = requests.post(up.base_url + "/api/v1/tasks", timeout=10,
                      json={"type": "test.poison", "payload": {"items": 10, "at": 5}})
    assert r.status_code == 202, r.text
    task_id = r.json()["task_id"]
    begun = time.monotonic()
    done = ended(up, task_id, timeout=30)
    took = time.monotonic() - begun
    assert done["status"] == "FAILED" and done["error"]["code"] == -3, done
    assert "at item 6 of 10" in done["error"]["message"], done  # the item it dies at, 1-based
    # the first crash moved the checkpoint (free), then TASKPORT_LOST_RUNS (2) crashes in a row without progress
    # ran again for free, and the next one failed it: no crash used an attempt
    assert (done["attempts"], done["resumed"]) == (1, 3), done
    conn = redis_of(up)
    try:
        runs = [e for e in audit.read(conn, task_id=task_id).entries if e["to"] == "PROCESSING"]
    finally:
        conn.close()
    assert len(runs) == 4, runs
    only_live_workers_counted(up)
    print(f"\npoison item: FAILED -3 after {len(runs)} runs, {took:.2f} s after the submit")
