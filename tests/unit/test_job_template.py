"""A first job's RQ commands from its queue's template equal RQ's own recording, byte for byte, and so does the Lua
table the submit script builds from the same template."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import rq.job
import rq.queue
from redis.connection import Encoder

import app.core.jobs
from app.core.jobs import TEMPLATE_ID, TEMPLATE_MEMBER, JobQueue, JobTemplate, job_templates, recorded_enqueue
from app.core.lines import line_command
from app.core.lua import Command, replay
from app.core.states import QUEUES


@pytest.fixture
def clock(monkeypatch):
    """RQ's ``now`` (and taskport's use of it) frozen, so both sides write the same times (a template reads the
    time once for created_at and enqueued_at, as a batch's jobs always did; RQ reads it twice)."""
    start = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    for module in (rq.job, rq.queue, app.core.jobs):
        monkeypatch.setattr(module, "now", lambda: start)
    return lambda: None


@pytest.mark.parametrize("priority", QUEUES)
@pytest.mark.parametrize("timeout", [1, 60, 3660])
def test_template_equals_rqs_own_enqueue(conn, config, clock, priority, timeout):
    jobs = JobQueue(conn, replace(config, api_keys="k1:heavy:3"))
    for member, weight in ((None, 0), ("public", 1), ("heavy", 3)):
        task_id = str(uuid.uuid4())
        ours = jobs.job_commands(task_id, priority, timeout, member=member)
        theirs = recorded_enqueue(jobs.queues[priority], task_id, timeout, None)
        if member is not None:
            theirs.append(line_command(priority, member, task_id, task_id, weight))
        assert ours == theirs
        assert [repr(a) for c in ours for a in c.args] == [repr(a) for c in theirs for a in c.args]  # same types


@pytest.mark.parametrize("priority", QUEUES)
def test_the_submit_scripts_table_is_the_templates_commands(conn, config, clock, priority):
    """The Lua table the submit script builds for its first job (app.core.jobs.job_templates, every constant a
    literal) holds the same bytes as the template's commands as lua.replay lays them out: what the script replays
    is what RQ's enqueue writes."""
    names = {"id": "task_id", "member": "member", "at": "job_at", "data": "job_data", "timeout": "job_timeout",
             "weight": "job_weight"}
    source = ("local job_queue, task_id, member, job_at, job_data, job_timeout, job_weight = unpack(ARGV)\n"
              "local job = nil\n" + job_templates("job_queue", "job", names) + "\nreturn job")
    jobs = JobQueue(conn, replace(config, api_keys="k1:it's:2"))
    for member in ("public", "it's", "a$@&!%\\b"):
        task_id = str(uuid.uuid4())
        first = jobs.first_job(task_id, priority, 77, member)
        sent = conn.eval(source, 0, first.queue, task_id, member, first.at, first.data, first.timeout, first.weight)
        commands = jobs.job_commands(task_id, priority, 77, at=first.at, member=member)
        keys_, args = replay(commands)
        encoder = Encoder("utf-8", "strict", False)
        assert sent == [encoder.encode(a) for a in args]
        assert first.keys == keys_


def test_a_recovery_job_id_is_rqs_own_recording(conn, config, clock):
    jobs = JobQueue(conn, config)
    task_id = str(uuid.uuid4())
    clock()
    ours = jobs.job_commands(task_id, "default", 60, job_id=f"{task_id}_1")
    clock()
    assert ours == recorded_enqueue(jobs.queues["default"], task_id, 60, f"{task_id}_1")
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
    recorded = [Command("HSET", f"rq:job:{TEMPLATE_ID}", ("origin", "default", "other", f"x{TEMPLATE_ID}".encode()))]
    with pytest.raises(RuntimeError, match="does not fill it in"):
        JobTemplate(recorded, None)


def test_a_string_holding_the_id_or_the_member_is_filled_in(clock):
    """Any string of RQ's recording that holds a placeholder gets the job's id and member in its place (a new field
    of RQ's that names the job would be written as RQ writes it)."""
    recorded = [Command("HSET", f"rq:job:{TEMPLATE_ID}", ("other", f"x{TEMPLATE_ID}:{TEMPLATE_MEMBER}y"))]
    filled = JobTemplate(recorded, app.core.jobs.TEMPLATES["default"].serializer).fill("t-1", 60, "m")
    assert filled == [Command("HSET", "rq:job:t-1", ("other", "xt-1:my"))]


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
