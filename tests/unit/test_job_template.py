"""A submit's RQ job commands from the per-(queue, timeout) template equal RQ's own recording, byte for byte."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import rq.job
import rq.queue

import app.core.jobs
from app.core.jobs import TEMPLATE_ID, JobQueue, JobTemplate
from app.core.lua import Command
from app.core.states import QUEUES


@pytest.fixture
def clock(monkeypatch):
    """RQ's ``now`` (and taskport's use of it) ticking 1 µs per call from one shared counter, so both sides
    see the same sequence of timestamps when reset."""
    start = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    state = {"ticks": itertools.count()}

    def now() -> datetime:
        return start + timedelta(microseconds=next(state["ticks"]))

    for module in (rq.job, rq.queue, app.core.jobs):
        monkeypatch.setattr(module, "now", now)
    return lambda: state.update(ticks=itertools.count())


@pytest.mark.parametrize("priority", QUEUES)
@pytest.mark.parametrize("timeout", [1, 60, 3660])
def test_template_equals_rqs_own_enqueue(conn, config, clock, priority, timeout):
    jobs = JobQueue(conn, config)
    jobs.job_commands(str(uuid.uuid4()), priority, timeout)  # the template is made at the first call, then reused
    for _ in range(3):
        task_id = str(uuid.uuid4())
        clock()
        ours = jobs.job_commands(task_id, priority, timeout)
        clock()
        theirs = jobs._recorded(task_id, priority, timeout, None)
        assert ours == theirs
        assert [repr(a) for c in ours for a in c.args] == [repr(a) for c in theirs for a in c.args]  # same types


def test_a_recovery_job_id_is_rqs_own_recording(conn, config, clock):
    jobs = JobQueue(conn, config)
    task_id = str(uuid.uuid4())
    clock()
    ours = jobs.job_commands(task_id, "default", 60, job_id=f"{task_id}_1")
    clock()
    assert ours == jobs._recorded(task_id, "default", 60, f"{task_id}_1")
    assert any(c.key.endswith(f"{task_id}_1") for c in ours)


def test_the_queued_job_runs_as_rqs_would(conn, config):
    """What the template writes is a job RQ reads back: its call, queue, timeout and description."""
    jobs = JobQueue(conn, config)
    task_id = str(uuid.uuid4())
    for name, key, args in jobs.job_commands(task_id, "low", 42):
        conn.execute_command(name, key, *args)
    job = rq.job.Job.fetch(task_id, connection=conn)
    assert (job.func_name, job.args, job.origin, job.timeout, job.description) == (
        app.core.jobs.RUN_TASK, (task_id,), "low", 42, f"task {task_id}")
    assert conn.lrange("rq:queue:low", 0, -1) == [task_id.encode()]


def test_a_layout_holding_the_id_elsewhere_is_refused():
    recorded = [Command("HSET", f"rq:job:{TEMPLATE_ID}", ("origin", "default", "other", f"x{TEMPLATE_ID}"))]
    with pytest.raises(RuntimeError, match="does not fill it in"):
        JobTemplate(recorded, None)


def test_rq_compress_writes_zlibs_own_bytes():
    """The job's data is compressed by a cheaper zlib setting (app.core.jobs.rq_compress): the bytes are
    zlib.compress's, for a job's pickled call of any task id and every length up to the cheap path's bound and past
    it (RQ decompresses them; an operator's tool may compare them)."""
    from pickle import HIGHEST_PROTOCOL, dumps
    from random import Random
    from zlib import compress

    from app.core.jobs import RUN_TASK, rq_compress

    for _ in range(2000):
        data = dumps((RUN_TASK, None, (str(uuid.uuid4()),), {}), protocol=HIGHEST_PROTOCOL)
        assert rq_compress(data) == compress(data)
    rng = Random(32)
    for n in range(300):
        for data in (bytes(rng.randrange(256) for _ in range(n)), bytes(rng.choice(b"ab-0") for _ in range(n)),
                     b"x" * n):
            assert rq_compress(data) == compress(data), n
