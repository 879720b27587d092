"""workers.worker's cheaper versions of RQ's per-job steps write what RQ's write: it takes RQ's default serializer
as resolved (the same object, without the Protocol check that cost ~6% of a no-op delivery's worker CPU; any other
serializer is still checked as RQ checks it), formats a job's start times by app.core.clock.rq_time, and reads a
job's times by datetime.fromisoformat."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import DefaultSerializer, JSONSerializer
from rq.utils import str_to_date, utcformat

from app.core.clock import rq_time
from app.core.jobs import FINISHED_JOB_TTL, RUN_TASK
from workers.worker import StoppableSimpleWorker, _job_time


@pytest.fixture
def protocol_walks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    walks: list[object] = []
    real = typing._get_protocol_attrs  # type: ignore[attr-defined]

    def walk(cls: type) -> object:
        walks.append(cls)
        return real(cls)

    monkeypatch.setattr(typing, "_get_protocol_attrs", walk)
    return walks


def test_a_jobs_default_serializer_is_not_checked_again(conn, protocol_walks: list[object]) -> None:
    job = Job("j1", connection=conn, serializer=DefaultSerializer)
    registries = [job.started_job_registry, job.finished_job_registry]
    assert protocol_walks == []
    assert job.serializer is DefaultSerializer and all(r.serializer is DefaultSerializer for r in registries)


def test_other_serializers_are_checked_as_rq_checks_them(conn, protocol_walks: list[object]) -> None:
    assert Job("j2", connection=conn, serializer=JSONSerializer).serializer is JSONSerializer
    assert protocol_walks
    with pytest.raises(NotImplementedError):
        Job("j3", connection=conn, serializer=object())


def test_a_jobs_start_writes_what_rqs_prepare_for_execution_writes(conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simple worker writes a job's start itself, its times formatted by app.core.clock.rq_time: the same
    fields, in the same order, with the same texts as RQ's own ``Job.prepare_for_execution``."""
    at = datetime(2026, 12, 7, 11, 40, 1, 20345, tzinfo=UTC)
    monkeypatch.setattr("workers.worker.now", lambda: at)
    monkeypatch.setattr("rq.job.now", lambda: at)
    worker = StoppableSimpleWorker(["default"], name="w1", connection=conn)
    ours, rqs = (Job.create(RUN_TASK, args=("t1",), id="j1", connection=conn) for _ in range(2))
    with conn.pipeline() as mine, conn.pipeline() as theirs:
        worker._start_job(ours, 60, mine)
        rqs.prepare_for_execution("w1", pipeline=theirs)
        [written] = [args for args, _ in mine.command_stack if args[:2] == ("HSET", ours.key)]
        assert written == theirs.command_stack[0][0]
    assert (ours.worker_name, ours.started_at, ours.last_heartbeat, ours.get_status(refresh=False)) == (
        rqs.worker_name, rqs.started_at, rqs.last_heartbeat, rqs.get_status(refresh=False))


def test_a_completed_jobs_end_is_what_rqs_calls_write(conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of a completed job in RQ, which TRANSITION replays (workers.worker._finish_commands), written out:
    the same commands, keys and arguments as RQ's own calls on a pipeline (the job's fields, its TTL, the finished
    registry's ``add`` with its score), with the job's started_at and worker_name in its HSET: the simple worker
    writes nothing of the job's start (workers.worker.StoppableSimpleWorker._recorded_start)."""
    at = datetime(2026, 12, 7, 11, 40, 1, 20345, tzinfo=UTC)
    monkeypatch.setattr("workers.worker.now", lambda: at)
    monkeypatch.setattr("workers.worker.current_timestamp", lambda: 1_796_644_801)
    monkeypatch.setattr("rq.registry.current_timestamp", lambda: 1_796_644_801)
    worker = StoppableSimpleWorker(["default"], name="w1", connection=conn)
    job = Job.create(RUN_TASK, args=("t1",), id="j1", connection=conn, origin="default")
    job.started_at = started = at - timedelta(seconds=3)
    queue = Queue("default", connection=conn)
    with conn.pipeline() as pipe:
        pipe.hset(job.key, mapping={"status": JobStatus.FINISHED, "ended_at": rq_time(at),
                                    "started_at": utcformat(started), "worker_name": "w1"})
        pipe.expire(job.key, FINISHED_JOB_TTL)
        queue.finished_job_registry.add(job, FINISHED_JOB_TTL, pipeline=pipe)
        rqs = [(str(args[0]), args[1], tuple(args[2:])) for args, _ in pipe.command_stack]
    ours = [tuple(command) for command in worker._finish_commands(job, queue, None)]  # type: ignore[arg-type]
    encode = conn.get_encoder().encode  # what goes on the wire
    assert [(name, key, [encode(a) for a in args]) for name, key, args in ours] == \
        [(name, key, [encode(a) for a in args]) for name, key, args in rqs]


@pytest.mark.parametrize("text", [
    "2026-12-07T11:40:01.020345Z", b"2026-12-07T11:40:01.020345Z", "2026-12-07T11:40:01Z", "2026-12-07T11:40:01.5Z",
    "1970-01-01T00:00:00.000000Z"])
def test_a_jobs_times_read_as_rq_reads_them(text: str | bytes) -> None:
    ours, rqs = _job_time(text), str_to_date(text)
    assert ours == rqs and ours.tzinfo is rqs.tzinfo


@pytest.mark.parametrize("text", [
    "2026-12-07 11:40:01.020345Z", "2026-12-07T11:40:01.020345+", "2026-13-07T11:40:01.020345Z",
    "2026-12-07T11:40:01,020345Z", "x" * 27, "2026-12-07T11:40:01.0203450"])
def test_a_time_rq_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        str_to_date(text)
    with pytest.raises(ValueError):
        _job_time(text)
