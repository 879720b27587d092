"""TaskService on fakeredis: submit, dedup, the active-task cap, cancel, history, through the service alone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rq.job import Job

from app.core import keys, processors
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.states import TaskStatus
from app.web.errors import Conflict, NotFound, TooManyRequests
from app.web.service import BadCursor, TaskService, dedup_digest


@pytest.fixture
def service(conn, config) -> TaskService:
    processors.load(config.processor_modules)
    return TaskService(conn, config)


def submit(service: TaskService, payload: dict[str, Any], member: str = "public", key: str | None = None):
    return service.submit(member, "demo.sleep", payload, key, None)


def queued(conn, queue: str = "default") -> list[str]:
    return [job.decode() for job in conn.lrange(f"rq:queue:{queue}", 0, -1)]


def test_submit_creates_the_task_and_queues_its_job_in_one_step(service, conn):
    outcome = submit(service, {"seconds": 0})
    assert outcome.created and outcome.task is not None and outcome.task.id == outcome.task_id
    assert outcome.task == service.store.get(outcome.task_id)
    assert outcome.task.status == TaskStatus.PENDING and outcome.task.priority == "default"
    assert queued(conn) == [outcome.task_id]
    job = Job.fetch(outcome.task_id, connection=conn)
    assert job.args == (outcome.task_id,) and job.timeout == processors.get("demo.sleep").timeout
    assert service.stats.read()["submitted"] == 1


def test_a_duplicate_names_and_reads_the_holder_and_queues_nothing(service, conn):
    first = submit(service, {"seconds": 0, "steps": 2})
    again = submit(service, {"steps": 2, "seconds": 0})  # same canonical JSON
    assert not again.created and again.task_id == first.task_id
    assert again.task == service.store.get(first.task_id)  # the holder's record, from the submit's own answer
    assert queued(conn) == [first.task_id] and service.stats.read()["submitted"] == 1
    by_key = submit(service, {"seconds": 1}, key="k-1")
    assert submit(service, {"seconds": 2}, key="k-1").task_id == by_key.task_id  # the key, not the payload
    assert submit(service, {"seconds": 0, "steps": 2}, member="bob").created  # dedup is per member


def test_a_duplicate_whose_holder_is_gone_names_it_without_a_record(service, conn):
    first = submit(service, {"seconds": 0})
    conn.delete(keys.task(first.task_id))  # the hash went before the dedup key (a tombstone's end)
    again = submit(service, {"seconds": 0})
    assert (again.created, again.task_id, again.task) == (False, first.task_id, None)


def test_the_priority_is_the_processors_unless_given(service, conn):
    outcome = service.submit("public", "demo.sleep", {"seconds": 0}, None, "high")
    assert outcome.task is not None and outcome.task.priority == "high" and queued(conn, "high") == [outcome.task_id]


def test_the_active_task_cap_refuses_with_429_and_writes_nothing(conn, tmp_path):
    config = Config.from_env({"TASKPORT_MAX_ACTIVE_TASKS": "1"}, redis_url="redis://fake", data_dir=tmp_path)
    service = TaskService(conn, config)
    processors.load(config.processor_modules)
    submit(service, {"seconds": 0})
    before = set(conn.keys())
    with pytest.raises(TooManyRequests) as refused:
        submit(service, {"seconds": 1})
    assert refused.value.extra["active"] == 1 and refused.value.headers["Retry-After"]
    assert set(conn.keys()) == before


def test_cancel_a_pending_task_removes_its_job(service, conn):
    outcome = submit(service, {"seconds": 0})
    service.cancel("public", outcome.task_id)
    assert service.find("public", outcome.task_id).status == TaskStatus.CANCELLED
    assert queued(conn) == [] and not Job.exists(outcome.task_id, connection=conn)
    with pytest.raises(Conflict) as again:
        service.cancel("public", outcome.task_id)
    assert again.value.extra["task_status"] == TaskStatus.CANCELLED


def test_someone_elses_unknown_and_malformed_ids_are_not_found(service):
    outcome = submit(service, {"seconds": 0})
    for member, task_id in (("bob", outcome.task_id), ("public", str(uuid.uuid4())), ("public", "not-an-id")):
        with pytest.raises(NotFound):
            service.find(member, task_id)
        with pytest.raises(NotFound):
            service.cancel(member, task_id)
    assert service.store.get(outcome.task_id).status == TaskStatus.PENDING


def test_history_pages_through_the_service_and_refuses_a_foreign_cursor(service):
    made = [submit(service, {"seconds": n}).task_id for n in range(3)]
    first = service.history("public", limit=2, cursor=None, status=None, type_=None, now=10**13 - 1)
    assert [t.id for t in first.tasks] == made[::-1][:2] and first.next_cursor
    rest = service.history("public", limit=2, cursor=first.next_cursor, status=None, type_=None, now=10**13 - 1)
    assert [t.id for t in rest.tasks] == made[:1] and rest.next_cursor is None
    with pytest.raises(BadCursor):
        service.history("public", limit=2, cursor="not-a-cursor", status=None, type_=None, now=0)


def test_the_job_layer_hands_over_rqs_own_commands(conn, config):
    commands = JobQueue(conn, config).job_commands("t-1", "low", 30)
    assert {c.name for c in commands} >= {"HSET", "RPUSH"}
    assert ("RPUSH", "rq:queue:low", ("t-1",)) in commands
    assert conn.keys() == []  # nothing was sent


def test_the_dedup_digest_is_canonical_and_keyed():
    assert dedup_digest("t", {"a": 1, "b": 2}, None) == dedup_digest("t", {"b": 2, "a": 1}, None)
    assert dedup_digest("t", {"a": 1}, None) != dedup_digest("u", {"a": 1}, None)
    assert dedup_digest("t", {"a": 1}, "k") == dedup_digest("u", {"b": 2}, "k")


def test_a_task_seen_out_of_its_line_is_read_plainly_until_it_is_back_in_one(service, conn, monkeypatch):
    """The place script costs ~10x an HGETALL in Redis CPU: once a process has seen a task run (or end), it reads
    it plainly; a read that shows it PENDING in a line again (a retry) goes through the script, so the
    document always has its place; any task it knows nothing of is read through the script (one round trip)."""
    waiting, running = submit(service, {"seconds": 0}), submit(service, {"seconds": 1})
    conn.hset(keys.task(running.task_id), "status", TaskStatus.PROCESSING)
    scripted: list[str] = []
    read = service.places.read
    monkeypatch.setattr(service.places, "read", lambda task_id: scripted.append(task_id) or read(task_id))
    for _ in range(3):
        task, place = service.find_placed("public", running.task_id)
        assert (task.status, place) == (TaskStatus.PROCESSING, None)
        task, place = service.find_placed("public", waiting.task_id)
        assert task.status == TaskStatus.PENDING and place is not None and place.position == 0
    assert scripted == [running.task_id] + [waiting.task_id] * 3
    conn.hset(keys.task(running.task_id), "status", TaskStatus.PENDING)  # back in its line (as a retry puts it)
    assert service.find_placed("public", running.task_id)[1] is not None
    assert service.find_placed("public", running.task_id)[1] is not None
    assert scripted[-2:] == [running.task_id] * 2
    with pytest.raises(NotFound):
        service.find_placed("bob", waiting.task_id)


def test_the_out_of_line_hint_keeps_the_newest_ids_only(service, monkeypatch):
    monkeypatch.setattr("app.web.service.OUT_OF_LINE_KEPT", 3)
    for n in range(5):
        service.out_of_line(f"id-{n}")
    assert list(service._out_of_line) == ["id-2", "id-3", "id-4"]
