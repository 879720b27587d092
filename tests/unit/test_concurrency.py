"""Concurrency limits (issue 31, app.core.limits): the start takes a slot or parks the task in its limit's line, the
run's end frees the slot and releases the oldest parked task, the tick queues it, the sweep frees lapsed slots;
and the config and registration that declare them. fakeredis with Lua; runs are started by hand."""

from __future__ import annotations

import uuid

import orjson
import pytest

from app.core import keys, limits, processors
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config, ConfigError
from app.core.jobs import JobQueue
from app.core.states import TaskStatus
from app.core.store import TaskStore
from app.core.task import Task

SPEC = "demo.sleep=2/member;orders.export=1/payload.customer;test.type=1/type"


def new(store: TaskStore, member: str = "acme", type_: str = "demo.sleep", payload: dict | None = None) -> str:
    task_id = uuid.uuid4().hex
    store.create(NewTask(task_id, member, type_, payload or {"seconds": 0}, uuid.uuid4().hex, "default", 1))
    return task_id


def start(store: TaskStore, task_id: str, spec: str = SPEC):
    return store.start(task_id, uuid.uuid4().hex, spec)


def task(store: TaskStore, task_id: str) -> Task:
    found = store.get(task_id)
    assert found is not None
    return found


def test_a_third_run_of_one_member_is_parked_pending_with_its_reason_and_another_member_runs(store) -> None:
    a1, a2, a3, b1 = new(store), new(store), new(store), new(store, "bob")
    assert start(store, a1).started and start(store, a2).started
    claim = start(store, a3)
    assert claim.started is None and claim.status == TaskStatus.PENDING
    assert claim.parked == "concurrency: demo.sleep member acme 2/2"
    parked = task(store, a3)
    assert parked.status == TaskStatus.PENDING and parked.attempts == 0 and parked.started_at is None
    assert parked.to_doc(now_ms())["waiting_for"] == ["concurrency: demo.sleep member acme 2/2"]
    assert parked.waits(now_ms())
    assert start(store, b1).started  # another member's slots are its own
    assert store.redis.zrange(keys.limit_parked("demo.sleep member acme"), 0, -1) == [a3.encode()]


def test_a_start_sent_twice_parks_once_and_answers_alike(store) -> None:
    ids = [new(store) for _ in range(3)]
    start(store, ids[0]), start(store, ids[1])
    run = uuid.uuid4().hex
    first, again = store.start(ids[2], run, SPEC), store.start(ids[2], run, SPEC)
    assert first == again and first.parked
    assert task(store, ids[2]).seq == 1  # one write: the second found it parked already


def test_the_end_of_a_run_releases_the_oldest_parked_task_whose_slot_is_reserved_and_the_tick_queues_it(
        store, config) -> None:
    ids = []
    for _ in range(4):  # created a millisecond apart at least: the line's order is their creation
        ids.append(new(store))
        created = task(store, ids[-1]).created_at
        while now_ms() <= created:
            pass
    runs = [uuid.uuid4().hex for _ in ids]
    assert all(store.start(t, r, SPEC).started for t, r in zip(ids[:2], runs, strict=False))
    assert start(store, ids[3]).parked and start(store, ids[2]).parked  # the line is by creation: ids[2] first
    assert store.complete(ids[0], runs[0], {"ok": 1}, items=None, failures=[], error_code=None)
    released = task(store, ids[2])
    assert released.status == TaskStatus.PENDING and released.limited is None
    assert released.to_doc(now_ms())["waiting_for"] is None
    assert store.redis.zscore(keys.LIMIT_READY, ids[2]) is not None
    late = new(store)  # a newcomer finds the slot reserved for the released task: it parks behind
    assert start(store, late).parked
    jobs = JobQueue(store.redis, config)
    assert limits.queue_released(store, jobs) == 1
    assert store.redis.zcard(keys.LIMIT_READY) == 0
    job = store.job_id(ids[2])
    assert job == f"{ids[2]}_c{released.seq}"
    assert store.redis.lrange("rq:queue:default", -1, -1) == [job.encode()]
    assert start(store, ids[2]).started  # its reserved slot
    assert store.redis.zcard(keys.limit_slots("demo.sleep member acme")) == 2


def test_every_end_frees_the_slot_cancel_fail_retry_put_back_and_recovery(store) -> None:
    for end in ("cancel", "fail", "put_back", "recover"):
        store.redis.flushall()
        a, b, c = new(store), new(store), new(store)
        run = uuid.uuid4().hex
        store.start(a, run, SPEC), start(store, b)
        assert start(store, c).parked
        if end == "cancel":
            assert store.cancel(a).done
        elif end == "fail":
            assert store.fail(a, run, -1, "boom")
        elif end == "put_back":
            assert store.interrupted(a, run, "stop", [], f"{a}_r1")
        else:
            assert store.recover(task(store, a), now_ms() + 1) == TaskStatus.PENDING
        assert task(store, c).limited is None, end
        assert task(store, a).to_doc(now_ms())["waiting_for"] is None
        held = {m.decode() for m in store.redis.zrange(keys.limit_slots("demo.sleep member acme"), 0, -1)}
        assert held == {b, c}, end


def test_a_parked_task_cancelled_leaves_the_line(store) -> None:
    a, b, c = new(store), new(store), new(store)
    start(store, a), start(store, b), start(store, c)
    assert store.cancel(c).done
    assert store.redis.zcard(keys.limit_parked("demo.sleep member acme")) == 0
    assert task(store, c).to_doc(now_ms())["waiting_for"] is None


def test_a_released_task_cancelled_before_it_starts_hands_its_slot_on(store, config) -> None:
    a, b, c, d = new(store), new(store), new(store), new(store)
    run = uuid.uuid4().hex
    store.start(a, run, SPEC), start(store, b), start(store, c), start(store, d)
    assert store.complete(a, run, {}, items=None, failures=[], error_code=None)  # c released
    assert store.cancel(c).done  # its reservation goes to d
    assert task(store, d).limited is None
    assert limits.queue_released(store, JobQueue(store.redis, config)) == 1  # d only: c is not PENDING


def test_a_slot_whose_holder_stalled_past_the_stall_timeout_lapses(store, config) -> None:
    a, b, c = new(store), new(store), new(store)
    start(store, a), start(store, b)
    assert start(store, c).parked
    store.redis.zadd(keys.RUNNING, {a: now_ms() - int(config.stall_timeout * 1000) - 1})  # a's worker died
    assert limits.sweep(store, now_ms()) == 1  # the backstop: c takes a's slot
    assert task(store, c).limited is None
    assert store.redis.zscore(keys.LIMIT_READY, c) is not None


def test_a_start_frees_a_lapsed_slot_itself(store, config) -> None:
    a, b, c = new(store), new(store), new(store)
    start(store, a), start(store, b)
    store.redis.zrem(keys.RUNNING, a)  # its run is gone without its end (a key lost, say)
    store.redis.hset(keys.task(a), "status", TaskStatus.FAILED)
    assert start(store, c).started


@pytest.mark.parametrize(("type_", "payload", "member", "key"), [
    ("orders.export", {"customer": "C-42", "format": "csv"}, "acme", "orders.export payload.customer C-42"),
    ("test.type", {}, "acme", "test.type type"),
])
def test_other_keys_type_and_a_payload_field(store, type_, payload, member, key) -> None:
    first, second, third = (new(store, m, type_, payload) for m in (member, "bob", member))
    assert start(store, first).started
    assert start(store, second).parked == f"concurrency: {key} 1/1"  # another member shares it
    assert start(store, third).parked


def test_a_long_payload_value_counts_by_its_first_64_characters(store) -> None:
    a, b = (new(store, payload={"customer": "x" * 64 + tail}, type_="orders.export") for tail in ("1", "2"))
    start(store, a)
    assert start(store, b).parked == f"concurrency: orders.export payload.customer {'x' * 64} 1/1"


def test_no_limit_no_slot(store) -> None:
    a = new(store)
    assert store.start(a, uuid.uuid4().hex, "").started
    assert store.redis.hlen(keys.LIMITS) == 0 and task(store, a).limited is None


def test_the_limits_in_use_per_limit_not_per_member(store) -> None:
    for member in ("acme", "bob"):
        for _ in range(3):
            start(store, new(store, member))
    assert limits.in_use(store.redis) == {"demo.sleep member": limits.LimitUse(held=4, parked=2)}


def test_the_reconciler_leaves_a_parked_task_alone(store, config) -> None:
    from workers.housekeeping import Housekeeper, PassReport

    ids = [new(store) for _ in range(3)]
    for t in ids:
        start(store, t)
    config = Config.from_env({}, redis_url="redis://fake", unqueued_bound=0.001)
    hk = Housekeeper(store.redis, config)
    report = PassReport("reconcile")
    for _ in range(2):
        hk.reconcile(report, now_ms() + config.task_ttl * 1000)
    assert report.counts.get("reconciled", 0) == 0


def test_the_spec_merges_the_processors_limits_with_the_operators() -> None:
    @processors.processor("test.limited", schema=processors.Schema(), concurrency=3, concurrency_key="payload.a.b")
    def limited(payload: dict, ctx) -> dict:
        return {}

    try:
        assert "test.limited=3/payload.a.b" in limits.concurrency_spec(Config.from_env({}))
        override = Config.from_env({"TASKPORT_CONCURRENCY": "test.limited=0/member,demo.sleep=3/member"})
        assert limits.concurrency_table(override) == {"demo.sleep": (3, "member")}
    finally:
        processors._REGISTRY.pop("test.limited")


@pytest.mark.parametrize(("options", "error"), [
    ({"concurrency": -1}, "concurrency must be"),
    ({"concurrency": 2, "concurrency_key": "tenant"}, "not member, type or payload"),
    ({"concurrency": 2, "concurrency_key": "payload."}, "not member, type or payload"),
])
def test_a_bad_declaration_is_refused(options, error) -> None:
    with pytest.raises(ValueError, match=error):
        processors.processor("test.bad", schema=processors.Schema(), **options)


@pytest.mark.parametrize(("value", "said"), [
    ("demo.sleep=2", "entry 1 ('demo.sleep=2') has no N/key after ="),
    ("demo.sleep=2/member,x=two/member", "entry 2 ('x=two/member') has N not a whole number"),
    ("a=2/tenant", "key 'tenant', not member, type or payload.<field>"),
    ("a=1/member,a=2/type", "a type named twice"),
])
def test_a_bad_concurrency_setting_is_one_clear_line(value, said) -> None:
    with pytest.raises(ConfigError, match=r"TASKPORT_CONCURRENCY entries look like") as raised:
        Config.from_env({"TASKPORT_CONCURRENCY": value})
    assert said in str(raised.value)


def test_the_payload_key_reads_a_nested_field(store) -> None:
    spec = "user.nested=1/payload.a.b"
    first = new(store, type_="user.nested", payload={"a": {"b": 7}})
    second = new(store, type_="user.nested", payload={"a": {"b": 7}})
    other = new(store, type_="user.nested", payload={"a": {"b": 8}})
    assert start(store, first, spec).started
    assert start(store, second, spec).parked == "concurrency: user.nested payload.a.b 7 1/1"
    assert start(store, other, spec).started
    assert orjson.loads(store.redis.get(keys.payload(other))) == {"a": {"b": 8}}


def test_metrics_show_the_limits_in_use_and_the_rates(store, client) -> None:
    for _ in range(3):
        start(store, new(store))
    store.redis.hset(keys.RATE_STATS, mapping={"erp:taken": 5, "erp:waited": 2})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'taskport_concurrency_slots_held{limit="demo.sleep member"} 2.0' in text
    assert 'taskport_concurrency_parked{limit="demo.sleep member"} 1.0' in text
    assert 'taskport_rate_limit_calls_total{limit="erp",outcome="taken"} 5.0' in text
    assert "acme" not in text  # a member is no label
