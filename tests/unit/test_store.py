"""TaskStore details on fakeredis. The behaviours every backend must share (create, dedup, the
compare-and-set transitions, history paging) are one test class in
tests/integration/test_store_contract.py, run against fakeredis and the real redis-server alike."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import re
import uuid
from collections.abc import Callable

import fakeredis
import pytest
from redis.crc import key_slot

from app.core import keys, lua, scripts
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.history import decode_cursor, encode_cursor
from app.core.jobs import rerun_job_id
from app.core.keys import STAT_INTERRUPTED
from app.core.rerun import rerun
from app.core.states import CLAIM_TAKEN, STORED, TRANSITIONS, TaskStatus
from app.core.store import TaskStore


def new_task(member: str = "public", digest: str | None = None, type_: str = "demo.sleep") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type=type_, payload={"seconds": 0},
                   dedup_digest=digest or task_id, priority="default", max_attempts=2)


def create(store, new: NewTask):
    return store.create(new)


def started(store, new: NewTask) -> str:
    run_id = uuid.uuid4().hex
    assert store.start(new.task_id, run_id).started is not None
    return run_id


def test_heartbeat_moves_running_score(store, conn):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    conn.zadd(keys.RUNNING, {new.task_id: 1})
    assert store.report(new.task_id, run_id, None) == TaskStatus.PROCESSING
    assert conn.zscore(keys.RUNNING, new.task_id) > 1


def test_a_large_result_gets_a_key_of_its_own_with_the_result_lifetime(store, conn, config):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    big = {"rows": list(range(100))}
    assert store.complete(new.task_id, run_id, big, items=None, failures=[], error_code=10002)
    assert store.get_with_result(new.task_id)[1] == {"result": big, "error_code": 10002}
    assert conn.hget(keys.task(new.task_id), "result") is None
    assert 0 < conn.ttl(keys.result(new.task_id)) <= config.result_ttl


def test_fail_records_the_error(store):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    assert store.fail(new.task_id, run_id, 10001, "bill unpaid")
    doc = store.get(new.task_id).to_doc(now_ms())
    assert doc["status"] == TaskStatus.FAILED and doc["error"] == {"code": 10001, "message": "bill unpaid"}


def test_read_past_expires_at_is_expired_before_housekeeping(store):
    new = new_task()
    _, _, task = create(store, new)
    doc = task.to_doc(253_402_300_799_000)
    assert doc["status"] == TaskStatus.EXPIRED and doc["error"]["code"] == -4


def test_cursor_round_trip_and_rejects_garbage():
    assert decode_cursor(encode_cursor((1700000000000.0, 3))) == (1700000000000, 3)
    def raw(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    garbage = ("x", "!!", encode_cursor((1.0, 1))[:-2] + "@@", "²", raw("1:" + str(2**63 + 1)), raw("1:" + "9" * 5000),
               raw(str(2**64) + ":0"), raw("1:-1"), raw("-5:0"), raw("1:²"), raw("١:٢"), raw("1.5:0"), raw("1:2:3"),
               raw("nan:0"), raw(" 1:2"), "A" * 10_000, raw("1:2"), "1-", "-1", "01-2", "1-02", "1-2-3", "1-2\n",
               "²-1", "1-" + "9" * 11, "9" * 17 + "-0", "1.5-0", " 1-2")
    for bad in garbage:
        with pytest.raises(ValueError):
            decode_cursor(bad)


# Every way the store changes a status. Each is applied below to a task in every stored status, and what
# it did is read back from the audit stream: a store method that changes a status belongs here.
STORE_MOVES: dict[str, Callable[[TaskStore, str, str], object]] = {
    "start": lambda store, task_id, run: store.start(task_id, uuid.uuid4().hex),
    "complete": lambda store, task_id, run: store.complete(task_id, run, {}, items=None, failures=[], error_code=None),
    "fail": lambda store, task_id, run: store.fail(task_id, run, 10001, "bill unpaid"),
    "retry": lambda store, task_id, run: store.retry(task_id, run, "again"),
    "cancel": lambda store, task_id, run: store.cancel(task_id),
    "expire": lambda store, task_id, run: store.expire_batch([task_id], now_ms()),
    "recover": lambda store, task_id, run: store.recover(store.get(task_id), now_ms() + 60_000),
    "recover the last attempt": lambda store, task_id, run: store.recover(
        dataclasses.replace(store.get(task_id), max_attempts=1), now_ms() + 60_000),
    "recover from a checkpoint": lambda store, task_id, run: store.recover(
        dataclasses.replace(store.get(task_id), max_attempts=1, checkpoints=1), now_ms() + 60_000),
    "graceful stop": lambda store, task_id, run: store.requeue(
        task_id, [], (), None, run_id=run, stat=STAT_INTERRUPTED, refund=True),
    "fail a dependent": lambda store, task_id, run: (  # as if it waited for a task that failed (after)
        store.redis.hset(keys.task(task_id), "waiting_for", "gone"), store.fail_waiting(task_id, "gone")),
    "run again": lambda store, task_id, run: rerun(store, task_id, rerun_job_id(task_id, 0), (), 1),
}
REACHED_BY = {TaskStatus.COMPLETED: "complete", TaskStatus.FAILED: "fail", TaskStatus.CANCELLED: "cancel",
              TaskStatus.EXPIRED: "expire"}


def task_in(store: TaskStore, status: str) -> tuple[str, str]:
    """A new task brought to ``status`` by the store's own moves; returns its id and its run id."""
    new, run = new_task(), ""
    create(store, new)
    if status in (TaskStatus.PROCESSING, TaskStatus.COMPLETED, TaskStatus.FAILED):
        run = started(store, new)
    if status in REACHED_BY:
        STORE_MOVES[REACHED_BY[status]](store, new.task_id, run)
    task = store.get(new.task_id)
    assert task is not None and task.status == status
    return new.task_id, run


@pytest.fixture(scope="module")
def performed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """Every (from, to) the store performs, with the first move seen doing it: each move on a task in
    each stored status, read back from the audit stream (one entry per transition)."""
    conn = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    store = TaskStore(conn, Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path_factory.mktemp("moves")))
    seen: dict[tuple[str, str], str] = {}
    for status in sorted(STORED):
        for name, move in STORE_MOVES.items():
            task_id, run = task_in(store, status)
            conn.delete(keys.AUDIT)
            move(store, task_id, run)
            for _, entry in conn.xrange(keys.AUDIT):
                assert entry[b"task"].decode() == task_id
                seen.setdefault((entry[b"from"].decode(), entry[b"to"].decode()), f"{name} on {status}")
    conn.close()
    return seen


def test_every_transition_the_store_performs_is_in_the_table(performed):
    assert {pair: move for pair, move in performed.items() if pair not in TRANSITIONS} == {}


@pytest.mark.parametrize("transition", sorted(TRANSITIONS), ids="{0[0]}->{0[1]}".format)
def test_every_transition_in_the_table_is_performed_by_the_store(performed, transition):
    assert transition in performed, f"no store move performs {transition}: drop it from app.core.states.TRANSITIONS"


# every function of app.core.keys builds a key, except all_static, the STATS field names (*_stat) and
# events_task_id (it reads a channel name)
KEY_BUILDERS = {name: fn for name, fn in vars(keys).items()
                if inspect.isfunction(fn) and fn.__module__ == keys.__name__
                and name not in {"all_static", "events_task_id"} and not name.endswith("_stat")}
STATIC_KEYS = {name: value for name, value in vars(keys).items()  # a key's head (BATCH_HEAD, ending ':') is no key
               if name.isupper() and isinstance(value, str) and value.startswith(keys.PREFIX) and value != keys.PREFIX
               and not value.endswith(":")}


@pytest.mark.parametrize("name", sorted(KEY_BUILDERS))
def test_every_key_builder_gives_a_prefixed_key_on_the_prefix_s_one_hash_slot(name):
    builder = KEY_BUILDERS[name]
    params = list(inspect.signature(builder).parameters)
    key = builder(*(f"<{param}>" for param in params))
    assert key.startswith(keys.PREFIX)
    assert key_slot(key.encode()) == key_slot(keys.PREFIX.encode())  # the prefix's {tp} is the key's one hash tag


def test_all_static_lists_every_fixed_key_once():
    assert sorted(keys.all_static()) == sorted(STATIC_KEYS.values())


def test_every_status_word_in_the_scripts_is_a_status_or_the_claim_answer():
    """The scripts spell statuses as Lua literals: a misspelt one would be a status no reader knows."""
    words = set(re.findall(r"'([A-Z_]{2,})'", " ".join(scripts.ALL.values())))
    not_statuses = words - {s.value for s in TaskStatus} - {CLAIM_TAKEN}
    assert CLAIM_TAKEN in words and TaskStatus.EXPIRED in words
    assert not_statuses <= {"SET", "HSET", "HGET", "HMGET", "HGETALL", "HINCRBY", "HDEL", "GET", "DEL", "ZADD",
                              "ZREM", "ZSCORE", "SADD", "EXPIRE", "PUBLISH", "NX", "EX", "PX", "XX", "MISSING_PAYLOAD",
                              "TIME", "XADD", "XTRIM", "MAXLEN", "MINID", "APPEND", "PTTL", "PEXPIRE",
                              "EXISTS", "SREM", "SCARD", "LPUSH", "LREM", "RPUSH", "STRLEN", "HSTRLEN",
                              "LRANGE", "LTRIM",  # the output's (app.core.outputscripts)
                              "ZCARD", "ZRANGE", "ZPOPMIN",  # the concurrency limits' (app.core.limitscripts)
                              "MGET"}  # the batch create's dedup keys (app.core.batchscripts)


def test_the_script_sources_spell_no_status_field_or_stat_by_hand():
    """Statuses, hash fields and stats counters reach the Lua as markers rendered from their one home."""
    bodies = " ".join(s.body for s in scripts.SCRIPTS.values()).replace(scripts.JOB_TEMPLATES, "")  # RQ's job fields
    hand_written = set(re.findall(r"'([A-Za-z_]{2,})'", bodies))
    homes = set(lua.STATUS_WORDS.values()) | set(lua.FIELD_WORDS) | set(lua.STAT_WORDS)
    assert not hand_written & homes
    audit_words = set(re.findall(r"'([A-Za-z_]{2,})'", scripts.AUDIT))  # its entry names: markers too (!task)
    assert not audit_words & set(lua.STATUS_WORDS.values())
    rendered = " ".join(source.removeprefix(lua.SHEBANG) for source in scripts.SOURCES.values())
    assert "'PENDING'" in rendered and "'status'" in rendered and "'submitted'" in rendered
    assert not re.search(r"[$@&!][A-Za-z_]", rendered)  # every marker rendered


def test_a_marker_outside_its_home_fails_at_render():
    with pytest.raises(KeyError):
        lua.render("return $DONE")
    with pytest.raises(KeyError):
        lua.render("redis.call('HGET', KEYS[1], @colour)")


def test_a_start_sent_again_by_the_same_run_is_answered_again_and_counts_once(store):
    """A Redis restart may lose a start's answer after the script ran; the client sends it again."""
    new = new_task()
    create(store, new)
    first = store.start(new.task_id, "run-1").started
    again = store.start(new.task_id, "run-1").started
    assert first is not None and again is not None and again.task.attempts == 1
    assert again.payload == first.payload
    assert store.start(new.task_id, "run-2").started is None  # another delivery still does nothing


@pytest.mark.parametrize("resumed", [False, True])
def test_a_starts_answer_is_the_task_document_as_written(store, conn, resumed):
    """START reads the task hash once (HGETALL) and answers it with its own writes applied, not a second HGETALL
    after them: the answer is, field for field and byte for byte, what the hash holds."""
    from app.core import runscripts
    new = new_task()
    create(store, new)
    if resumed:  # a checkpoint to resume from: @resumed and @checkpoints written too
        run_id = started(store, new)
        store.report(new.task_id, run_id, 10, checkpoint=b'{"c":[1,0,0]}')
        assert store.interrupted(new.task_id, run_id, "a worker stop", [], "job-r")
    answer = store.run_script(runscripts.START.name, *store._start_call(new.task_id, "run-9", "", "worker-1"))
    assert answer[0] == 1
    flat = answer[2]
    assert dict(zip(flat[::2], flat[1::2], strict=True)) == conn.hgetall(keys.task(new.task_id))


def test_started_at_is_the_first_start_a_resume_and_a_retry_keep_it_and_a_run_again_resets_it(store, conn):
    """It was overwritten at each resume: a task interrupted after an hour showed a start of a minute ago."""
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    first = store.get(new.task_id).started_at
    conn.hset(keys.task(new.task_id), "started_at", first - 3_600_000)  # the first run began an hour ago
    first -= 3_600_000
    assert store.interrupted(new.task_id, run_id, "a worker stop", [], "job-r")
    run_id = started(store, new)  # the resume
    assert store.get(new.task_id).started_at == first
    assert store.retry(new.task_id, run_id, "again")
    run_id = started(store, new)  # the retry
    assert store.get(new.task_id).started_at == first
    assert store.fail(new.task_id, run_id, 10001, "bill unpaid")
    assert rerun(store, new.task_id, "job-a", (), 1).task.started_at is None
    started(store, new)
    assert store.get(new.task_id).started_at > first


def test_a_created_task_s_fields_begin_with_the_head_the_create_reads_its_audit_entry_from(store):
    """The create script reads the audit entry's values at their places in CREATED_HEAD (app.core.creation), not by
    name: every created task's fields (a submit's, each of a batch's, with or without run_at) must begin with it."""
    from app.core.creation import CREATED_HEAD

    new = dataclasses.replace(new_task(), priority="high", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    for run_at in (None, now_ms() + 60_000):
        _, fields, _ = store.task_fields(new, now_ms(), run_at)
        assert tuple(fields[0:2 * len(CREATED_HEAD):2]) == CREATED_HEAD


@pytest.mark.parametrize("variant", ["plain", "high", "one_attempt", "run_at", "after", "callback", "batch", "then"])
def test_a_created_task_is_the_task_read_back_from_what_was_written(store, variant):
    """A submit answers with the task it wrote, built from the values it sent (Task.created), not read back:
    it must equal the task its hash gives (Task.from_hash of HGETALL), in every shape a submit makes."""
    dep = new_task()
    create(store, dep)
    new = new_task()
    changes = {"high": {"priority": "high"}, "one_attempt": {"max_attempts": 1, "priority": "low"},
               "callback": {"callback_url": "https://example.com/hook", "callback_events": ("completed",)},
               "batch": {"batch": "b" * 26}, "then": {"then_of": "c" * 26}}.get(variant, {})
    new = dataclasses.replace(new, **changes)
    run_at = now_ms() + 60_000 if variant == "run_at" else None
    created = store.create(new, run_at=run_at, after=[dep.task_id] if variant == "after" else ())
    assert created.created and created.task is not None
    assert created.task == store.get(new.task_id)
    assert (created.task.waiting_for == (dep.task_id,)) == (variant == "after")
