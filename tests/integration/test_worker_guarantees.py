"""What the fast worker default must not cost (issue 11), with real processes under `taskport up`:

- a running task that never checkpoints is still stopped within 2 s of its cancel: the in-process
  (simple) worker ends itself once the processor ignores the cancel for ``CANCEL_GRACE``, and the
  supervisor starts a new one; the fork worker kills its work horse;
- such a task still times out with -2;
- a processor that ends its own process (``os._exit``, a segfault) loses no other task, and its own
  task is recovered (attempt 2) by stall recovery;
- a worker exits after ``TASKPORT_WORKER_MAX_JOBS`` jobs and the supervisor starts a new one (what
  bounds a worker's memory; the RSS over 100,000 tasks is measured in bench/README.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from app.core.process import alive
from tests.integration.harness import TASKS, Api, Up, children, running_workers, started, task_workers, wait_until

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

ENV = {
    "TASKPORT_PROCESSORS": "tests.userprocs.tasks",
    "TASKPORT_HEARTBEAT_INTERVAL": "0.2",
    "TASKPORT_STALL_TIMEOUT": "2",
    "TASKPORT_HOUSEKEEPING_INTERVAL": "1",
    "TASKPORT_SCHEDULER_INTERVAL": "0.5",
}
STOPPED_WITHIN = 2.0  # seconds from the DELETE until the process running the task is gone


def start(up_factory: Callable[..., Up], **env: str) -> Up:
    return started(up_factory, {**ENV, **env})


def quick(api: Api) -> str:
    return api.create("demo.sleep", {"steps": 1}, dedup_key=uuid.uuid4().hex)


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_task_that_never_checkpoints_is_stopped_within_2s_of_its_cancel(
        up_factory: Callable[..., Up], worker_class: str) -> None:
    up = start(up_factory, TASKPORT_WORKER_CLASS=worker_class, TASKPORT_WORKERS="1")
    with Api(up.base_url) as api:
        stuck = api.create("test.stuck", {"seconds": 60})
        api.wait_for(stuck, "PROCESSING")
        conn = redis.Redis.from_url(up.redis_url())
        wait_until(lambda: running_workers(conn, stuck),
                   message="the worker to hold the job")
        [worker] = task_workers(conn)
        conn.close()
        # the simple worker runs the task itself; the fork worker in its (newest) child, the work horse
        pid = worker.pid if worker_class == "simple" else max(children(worker.pid))
        cancelled_at = time.monotonic()
        assert api.delete(f"{TASKS}/{stuck}").status_code == 204
        wait_until(lambda: not alive(pid), timeout=STOPPED_WITHIN + 1, message="the process running it to end")
        took = time.monotonic() - cancelled_at
        assert took < STOPPED_WITHIN, f"the {worker_class} worker's task ran {took:.2f} s past its cancel"
        at_cancel = api.status(stuck)
        assert at_cancel["status"] == "CANCELLED"
        assert api.wait_for(quick(api), "COMPLETED", timeout=20)["status"] == "COMPLETED"  # a worker serves again
        assert api.status(stuck) == at_cancel
    if worker_class == "simple":
        assert "ignored it for 1.0 s: ending process" in up.output()
        assert up.exits("worker")  # supervisor saw the exit and started a new worker


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_task_that_never_checkpoints_times_out_with_minus_2(up_factory: Callable[..., Up],
                                                               worker_class: str) -> None:
    up = start(up_factory, TASKPORT_WORKER_CLASS=worker_class, TASKPORT_WORKERS="1")
    with Api(up.base_url) as api:
        slow = api.create("test.slow", {"seconds": 30})  # a 1 s job timeout
        failed = api.wait_for(slow, "FAILED")
        assert failed["error"] == {"code": -2, "message": "task timed out"}
        assert api.wait_for(quick(api), "COMPLETED")["status"] == "COMPLETED"


@pytest.mark.parametrize("how", ["exit", "segfault"])
@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_processor_that_kills_its_process_loses_no_other_task(up_factory: Callable[..., Up], tmp_path: Path,
                                                                 worker_class: str, how: str) -> None:
    up = start(up_factory, TASKPORT_WORKER_CLASS=worker_class)
    with Api(up.base_url) as api:
        others = [quick(api) for _ in range(10)]
        crash = api.create("test.crash", {"marker": str(tmp_path / "calls"), "how": how})
        others += [quick(api) for _ in range(30)]
        for task_id in others:
            assert api.wait_for(task_id, "COMPLETED", timeout=30)["status"] == "COMPLETED"
        done = api.wait_for(crash, "COMPLETED", timeout=30)  # stall recovery: stalled after 2 s, re-queued
        assert done["attempts"] == 1, done  # the crashed run gave its attempt back (a crash is not the task's fault)
        assert api.get(f"{TASKS}/{crash}/result").json()["result"] == {"calls": 2}


def test_a_worker_is_recycled_after_max_jobs(up_factory: Callable[..., Up]) -> None:
    up = start(up_factory, TASKPORT_WORKERS="1", TASKPORT_WORKER_MAX_JOBS="20")
    first = up.pid("worker")
    with Api(up.base_url) as api:
        tasks = [quick(api) for _ in range(30)]
        for task_id in tasks:  # the last 10 need the worker supervisor started after the first one's 20
            assert api.wait_for(task_id, "COMPLETED", timeout=30)["status"] == "COMPLETED"
    assert up.pid("worker") != first
    assert [e for e in up.exits("worker") if e.startswith("exit status 0")], up.output()
