"""Submit's cost on a real server: one round trip for a new task and for a duplicate, counted on the wire."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import rq.job
import rq.queue
from redis.connection import Connection, UnixDomainSocketConnection
from rq import Queue
from rq.job import Job

import app.core.jobs
from app.core import keys, processors
from app.core.config import Config
from app.core.states import QUEUES
from app.web.service import TaskService
from tests.integration.harness import RedisServer

_sent = [0]
_lock = threading.Lock()


class _Counting:
    """Counts every request a connection sends: one command, one script call or one whole pipeline."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with _lock:
            _sent[0] += 1
        super().send_packed_command(command, check_health)  # type: ignore[misc]


class _CountingUnix(_Counting, UnixDomainSocketConnection):
    pass


class _CountingTcp(_Counting, Connection):
    pass


def round_trips(run: Any) -> int:
    with _lock:
        _sent[0] = 0
    run()
    with _lock:
        return _sent[0]


@pytest.fixture
def service(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[TaskService]:
    config = Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path)
    processors.load(config.processor_modules)
    conn = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    pool = conn.connection_pool
    pool.connection_class = _CountingUnix if issubclass(pool.connection_class, UnixDomainSocketConnection) \
        else _CountingTcp
    service = TaskService(conn, config)
    service.submit("public", "demo.sleep", {"seconds": 0, "label": "warm-up"}, None, None)  # loads the script
    yield service
    conn.close()


def test_a_new_task_and_a_duplicate_each_cost_one_round_trip(service: TaskService, redis_conn: redis.Redis) -> None:
    payload = {"seconds": 0, "label": "counted"}
    before = redis_conn.info("commandstats")
    outcome: list[Any] = []
    assert round_trips(lambda: outcome.append(service.submit("public", "demo.sleep", payload, None, None))) == 1
    assert round_trips(lambda: outcome.append(service.submit("public", "demo.sleep", payload, None, None))) == 1
    created, duplicate = outcome
    assert created.created and not duplicate.created and duplicate.task_id == created.task_id
    assert duplicate.task is not None and duplicate.task.id == created.task_id  # read inside the one script call
    after = redis_conn.info("commandstats")
    calls = {name: after[name]["calls"] - before.get(name, {}).get("calls", 0) for name in after}
    assert calls["cmdstat_evalsha"] == 2  # the two submits, and no other command sent by the client
    # the dedup reads and the holder's hash; no look for the new task itself: with the default dedup window (300 s)
    # the key outlives any repeat of the call (Config.call_record_ms, 124 s), so finding none proves a first call
    assert calls.get("cmdstat_get", 0) == 2 and calls.get("cmdstat_exists", 0) == 0 and calls["cmdstat_hgetall"] == 1


@pytest.mark.parametrize("window", [1, 300])
def test_a_repeat_of_a_submit_creates_nothing_whatever_the_dedup_window(service: TaskService, redis_conn: redis.Redis,
                                                                        window: int) -> None:
    """The same call sent again (its reply lost) is answered "created" from its own task and writes nothing more.
    With a dedup window shorter than a repeat may come (1 s against Config.call_record_ms) the key may have lapsed
    (gone here): the script then looks for its task (EXISTS). With a longer one it finds its key still held."""
    config = replace(service.config, dedup_window=window)
    assert (window * 1000 < config.call_record_ms) == (window == 1)
    repeating = TaskService(service.redis, config)
    store = repeating.store
    sent: list[tuple[str, list[str], list[Any]]] = []
    run = store.run_script

    def kept(name: str, keys_: list[str], args: list[Any], *rest: Any, **options: Any) -> Any:
        sent.append((name, keys_, args))
        return run(name, keys_, args, *rest, **options)

    store.run_script = kept  # type: ignore[method-assign]
    first = repeating.submit("public", "demo.sleep", {"seconds": 0, "label": "twice"}, None, None)
    assert first.created
    name, keys_, args = sent[-1]
    if window == 1:
        redis_conn.delete(keys_[0])  # the dedup key lapsed before the repeat came
    queued = redis_conn.llen("rq:queue:default")
    before = redis_conn.info("commandstats").get("cmdstat_exists", {}).get("calls", 0)
    assert list(run(name, keys_, args)[:1]) == [1]  # answered "created", as the first time
    looked = redis_conn.info("commandstats").get("cmdstat_exists", {}).get("calls", 0) - before
    assert looked == (1 if window == 1 else 0)
    assert redis_conn.llen("rq:queue:default") == queued  # no second job
    assert redis_conn.zcard(keys.history("public")) == 2  # the warm-up's task and this one, once


def test_a_submit_reads_the_counters_of_a_cap_only_when_the_cap_is_on(service: TaskService,
                                                                       redis_conn: redis.Redis) -> None:
    """Open mode has no cap on unfinished tasks nor on stored bytes: nothing to compare, so nothing is read."""
    assert (service.config.active_task_cap, service.config.stored_bytes_cap) == (0, 0)

    def hgets(submit: Any) -> int:
        before = redis_conn.info("commandstats").get("cmdstat_hget", {}).get("calls", 0)
        submit()
        return int(redis_conn.info("commandstats").get("cmdstat_hget", {}).get("calls", 0)) - before

    assert hgets(lambda: service.submit("public", "demo.sleep", {"seconds": 0, "label": "off"}, None, None)) == 0
    capped = TaskService(service.redis, replace(service.config, max_active_tasks="5", max_stored_bytes="1mb"))
    assert hgets(lambda: capped.submit("public", "demo.sleep", {"seconds": 0, "label": "on"}, None, None)) == 2


def test_a_submit_writes_rqs_job_hash_in_one_hset_the_same_to_the_byte(service: TaskService, redis_conn: redis.Redis,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """RQ's enqueue writes its job hash in two HSETs (the status, then every field, the status again); the submit
    script sends them as one, and the hash is the same to the byte (DUMP) as RQ's own two writes make it:
    rq-dashboard and ``rq info`` read it. The task's own hash is written once, its place in line with its other
    fields: two HSETs in all (four before)."""
    monkeypatch.setattr(app.core.jobs, "rq_now", lambda: "2026-01-02T03:04:05.678901Z")  # both sides' times

    def hsets(submit: Any) -> int:
        before = redis_conn.info("commandstats").get("cmdstat_hset", {}).get("calls", 0)
        submit()
        return int(redis_conn.info("commandstats").get("cmdstat_hset", {}).get("calls", 0)) - before

    outcome: list[Any] = []
    assert hsets(lambda: outcome.append(service.submit("public", "demo.sleep", {"seconds": 0, "label": "one"},
                                                       None, None))) == 2
    task = outcome[0].task
    processor = processors.get("demo.sleep")
    assert processor is not None
    job_key = Job.key_for(task.id)
    ours = redis_conn.dump(job_key)
    redis_conn.delete(job_key)
    for name, key, args in service.jobs.job_commands(task.id, task.priority, processor.timeout):
        if key == job_key:
            redis_conn.execute_command(name, key, *args)
    assert redis_conn.dump(job_key) == ours


@pytest.mark.parametrize("priority", QUEUES)
def test_a_submits_job_is_rqs_own_enqueue_field_by_field(service: TaskService, redis_conn: redis.Redis,
                                                         monkeypatch: pytest.MonkeyPatch, priority: str) -> None:
    """The submit script writes a task's RQ job from its queue's template (in the script) and the call's few values:
    the job hash is the one RQ's own ``Queue.enqueue_job`` makes on this server, field by field and to the byte
    (DUMP), and RQ reads it back as its job (``Job.fetch``: what rq-dashboard, ``rq info`` and the worker's claim
    read). RQ's clock is frozen for both (a template reads the time once for created_at and enqueued_at)."""
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    for module in (rq.job, rq.queue, app.core.jobs):
        monkeypatch.setattr(module, "now", lambda: at)
    weighted = TaskService(service.redis, replace(service.config, api_keys="k1:heavy:3"))
    for svc, member in ((service, "public"), (weighted, "heavy")):
        outcome = svc.submit(member, "orders.export", {"rows": 1, "format": "csv"}, None, priority)
        task_id = outcome.task_id
        job_key = Job.key_for(task_id)
        ours, our_bytes = redis_conn.hgetall(job_key), redis_conn.dump(job_key)
        queue_key = f"rq:queue:{priority}"
        assert redis_conn.lrange(queue_key, -1, -1) == [task_id.encode()]
        redis_conn.delete(job_key)
        queue = Queue(priority, connection=redis_conn)  # RQ's own enqueue of taskport's job, not the template
        queue.enqueue_job(queue.create_job(
            app.core.jobs.RUN_TASK, args=(task_id,), job_id=task_id, timeout=3600, result_ttl=app.core.jobs.RESULT_TTL,
            failure_ttl=app.core.jobs.FAILED_JOB_TTL, description=f"task {task_id}",
            on_stopped=app.core.jobs.ON_STOPPED))
        theirs = redis_conn.hgetall(job_key)
        assert list(ours) == list(theirs)
        for field, value in theirs.items():
            assert ours[field] == value, field
        assert our_bytes == redis_conn.dump(job_key)
        job = Job.fetch(task_id, connection=redis_conn)
        assert (job.func_name, job.args, job.origin, job.timeout, job.get_status()) == (
            app.core.jobs.RUN_TASK, (task_id,), priority, 3600, "queued")
        assert redis_conn.lrange(queue_key, -2, -1) == [task_id.encode()] * 2  # ours, then RQ's RPUSH
        assert redis_conn.sismember("rq:queues", queue_key)
        line = redis_conn.hget(keys.task(task_id), "line")
        assert line is not None and line.decode().endswith(f" {task_id}")
        assert redis_conn.lrange(keys.line(priority, member), -1, -1) == [task_id.encode()]
        weight = redis_conn.hget(keys.lines(priority), f"w:{member}")
        assert weight == (b"3" if member == "heavy" else None)


def test_a_submit_sends_none_of_rqs_fixed_job_fields(service: TaskService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's fields that are the same for every job of a queue (its origin, TTLs, callbacks, the empty fields,
    the commands' names) are in the submit script (its queue's template), not in each call: 94 arguments a plain
    submit before, 40 now (bench/README.md, "Submit, seventh pass")."""
    sent: list[list[Any]] = []
    run = service.store.run_script

    def kept(name: str, keys_: list[str], args: list[Any], *rest: Any, **options: Any) -> Any:
        if name == "submit":
            sent.append(list(args))
        return run(name, keys_, args, *rest, **options)

    monkeypatch.setattr(service.store, "run_script", kept)
    assert service.submit("public", "demo.sleep", {"seconds": 0, "label": "few"}, None, None).created
    [args] = sent
    assert not {"origin", "failure_ttl", "stopped_callback_name", "HSET", "in_line"} & {str(a) for a in args}
    assert len(args) <= 40


def test_a_member_joins_the_members_set_at_its_first_unfinished_task_only(service: TaskService,
                                                                           redis_conn: redis.Redis) -> None:
    """keys.MEMBERS (whose histories housekeeping trims) gets a member when its count of unfinished tasks comes to 1;
    a submit by a member with another unfinished task adds nothing there (a no-op SADD less: RQ's own SADD of its
    set of queues is the one left). A member whose tasks all ended is added again (a no-op too), never lost."""

    def sadds(member: str, label: str) -> int:
        before = redis_conn.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0)
        assert service.submit(member, "demo.sleep", {"seconds": 0, "label": label}, None, None).created
        return int(redis_conn.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0)) - before

    assert sadds("newcomer", "first") == 2  # RQ's set of queues, and the member's first task
    assert redis_conn.sismember(keys.MEMBERS, "newcomer")
    assert sadds("newcomer", "second") == 1  # RQ's only: the member is there
    redis_conn.hdel(keys.ACTIVE, "newcomer")  # as when its tasks have all ended (TRANSITION drops the count at 0)
    assert sadds("newcomer", "third") == 2
    assert redis_conn.sismember(keys.MEMBERS, "newcomer")
