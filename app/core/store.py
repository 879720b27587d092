"""TaskStore: every read and write of a task's Redis data goes through here.

Writes are the Lua scripts of :mod:`app.core.scripts` (one atomic compare-and-set each); reads are one
round trip (HGETALL, or a pipeline when the result is needed too).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis

from app.core import audit, keys, scripts
from app.core.clock import now_ms
from app.core.config import Config
from app.core.ids import digest
from app.core.keys import STAT_ENTERED, STAT_RECOVERED, STAT_RETRIED
from app.core.keys import TaskField as F
from app.core.scripts import Command
from app.core.states import ACTIVE, ERROR_MESSAGES, TERMINAL, ErrorCode, TaskStatus
from app.core.task import Task

# A result whose JSON is at most this long lives in the task's hash instead of a key of its own: Redis
# keeps a hash compact (ziplist/listpack) while every value is within hash-max-ziplist-value (64 by
# default), and a key of its own costs more than a hundred bytes of bookkeeping.
INLINE_RESULT_MAX = 64
# A filtered history page examines at most this many index entries per task it may return (see history).
HISTORY_SCAN = 5


class ActiveCapReached(Exception):
    """A submit refused: the member already holds ``cap`` unfinished tasks (``Config.active_task_cap``)."""

    def __init__(self, cap: int, active: int) -> None:
        super().__init__(f"{active} unfinished tasks, the cap is {cap}")
        self.cap, self.active = cap, active


class ResultNotStorable(ValueError):
    """A processor's output cannot be stored (not JSON-serializable, or over ``Config.max_result``)."""


@dataclass(frozen=True)
class NewTask:
    task_id: str
    member: str
    type: str
    payload: dict[str, Any]
    dedup_digest: str
    priority: str
    max_attempts: int


class Created(NamedTuple):
    """What a submit did: ``created``, or not (a duplicate) and ``task_id`` names the task holding the
    dedup key. ``task`` is the new task as written, or the holder as read (None if it vanished meanwhile)."""

    created: bool
    task_id: str
    task: Task | None


@dataclass(frozen=True)
class Started:
    """What a worker needs once it owns a task."""

    task: Task
    payload: dict[str, Any]


@dataclass(frozen=True)
class Claim:
    """What :meth:`TaskStore.start` found: ``started`` when this run took the task; else None, and
    ``status`` is the status that prevented it ('' when the task is gone)."""

    status: str
    started: Started | None = None


class Transition(NamedTuple):
    """A compare-and-set's answer: ``done``, and the status the task left (done) or is in (not done;
    '' when it is gone)."""

    done: bool
    status: str


class WithResult(NamedTuple):
    """A task and its stored result (None until it completes), read in one round trip."""

    task: Task | None
    result: dict[str, Any] | None


class Expired(NamedTuple):
    """A task housekeeping expired: the status it left and its RQ job id."""

    task_id: str
    previous: str
    job: str


@dataclass(frozen=True)
class Page:
    tasks: list[Task]
    next_cursor: str | None


def _items_fields(items: dict[str, int] | None) -> list[Any]:
    if items is None:
        return []
    return [F.ITEMS_TOTAL, items["total"], F.ITEMS_SUCCEEDED, items["succeeded"], F.ITEMS_FAILED, items["failed"]]


class TaskStore:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.redis: Any = conn  # redis-py's bytes|str unions say nothing here: replies are bytes (no decoding)
        self.config = config
        self._sources = scripts.build(*config.audit_limits)  # the audit retention is rendered into the scripts
        self._scripts = {name: conn.register_script(src) for name, src in self._sources.items()}

    def run_script(self, name: str, keys_: list[str], args: list[Any], client: Any = None) -> Any:
        """Run a script now (EVALSHA, loading it on NOSCRIPT), or queue it on a caller's pipeline.

        On a pipeline it goes as EVAL with its source: an EVALSHA that met an empty script cache (a
        restarted Redis) would fail inside MULTI while the rest of the transaction still applied, and
        redis-py's own remedy costs a SCRIPT EXISTS round trip on every execute. Every write of the
        store goes through here: the one seam a subclass overrides to send them its own way
        (bench.fill batches them on a pipeline).
        """
        keys_ = [*keys_, keys.AUDIT]  # every script's last key: see scripts.AUDIT
        if client is None:
            return self._scripts[name](keys=keys_, args=args)
        return client.eval(self._sources[name], len(keys_), *keys_, *args)

    # -- submit ---------------------------------------------------------------------------------
    def create(self, new: NewTask, job: Sequence[Command] = ()) -> Created:
        """Create the task and queue its job, unless its dedup key is held: one script, one round trip,
        a duplicate included (the script answers with the holder's record). Raises ActiveCapReached,
        writing nothing, when the member holds ``Config.active_task_cap`` unfinished tasks already.

        ``job`` is the commands that queue the task's RQ job (:meth:`app.core.jobs.JobQueue.job_commands`): the
        submit script replays them once it has created the task, so a duplicate queues nothing (tests
        that start tasks by hand pass none).
        """
        c = self.config
        created = now_ms()
        body = orjson.dumps(new.payload)
        fields = [
            F.TYPE, new.type, F.MEMBER, new.member, F.STATUS, TaskStatus.PENDING,
            F.PROGRESS, 0, F.ATTEMPTS, 0, F.MAX_ATTEMPTS, new.max_attempts, F.PRIORITY, new.priority,
            F.CREATED_AT, created, F.UPDATED_AT, created, F.EXPIRES_AT, created + c.task_ttl * 1000, F.SEQ, 0,
            F.PAYLOAD_SHA256, digest(body),
        ]  # fmt: skip
        job_keys, job_args = scripts.replay(job)
        key_ttl = c.task_ttl + c.tombstone_ttl
        answer = self.run_script(
            "submit",
            [keys.dedup(new.member, new.dedup_digest), keys.task(new.task_id), keys.payload(new.task_id),
             keys.history(new.member), keys.EXPIRY, keys.MEMBERS, keys.STATS, keys.ACTIVE, *job_keys],
            [new.task_id, c.dedup_window, key_ttl, created, created + c.task_ttl * 1000,
             body, new.member, c.active_task_cap, len(job_args), *job_args, *fields],
        )  # fmt: skip
        if answer[0] == 2:
            raise ActiveCapReached(c.active_task_cap, int(answer[1]))
        if answer[0] == 1:
            written = {str(k).encode(): str(v).encode() for k, v in zip(fields[::2], fields[1::2], strict=True)}
            return Created(True, new.task_id, Task.from_hash(written, new.task_id))
        holder = answer[1].decode()
        return Created(False, holder, Task.from_hash(_pairs(answer[2]), holder) if answer[2] else None)

    # -- reads ----------------------------------------------------------------------------------
    def get(self, task_id: str) -> Task | None:
        h = self.redis.hgetall(keys.task(task_id))
        return Task.from_hash(h, task_id) if h else None

    def get_with_result(self, task_id: str) -> WithResult:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.task(task_id))
        pipe.get(keys.result(task_id))
        h, raw = pipe.execute()
        if not h:
            return WithResult(None, None)
        raw = h.get(_RESULT) or raw
        return WithResult(Task.from_hash(h, task_id), orjson.loads(raw) if raw else None)

    def get_many(self, task_ids: list[str]) -> list[Task | None]:
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hgetall(keys.task(task_id))
        return [Task.from_hash(h, t) if h else None for h, t in zip(pipe.execute(), task_ids, strict=True)]

    # -- worker side ----------------------------------------------------------------------------
    def start(self, task_id: str, run_id: str) -> Claim:
        """PENDING -> PROCESSING for this run: what it found (see :class:`Claim`)."""
        t = now_ms()
        answer = self.run_script(
            "start",
            [keys.task(task_id), keys.payload(task_id), keys.RUNNING, keys.events(task_id)],
            [run_id, t, task_id],
        )
        if answer[0] != 1:
            return Claim(answer[1].decode())
        started = Started(task=Task.from_hash(_pairs(answer[2]), task_id), payload=orjson.loads(answer[1]))
        return Claim(TaskStatus.PROCESSING, started)

    def report(
        self, task_id: str, run_id: str, progress: int | None, message: str | None = None,
        items: dict[str, int] | None = None,
    ) -> str:
        """Progress (or, with progress None, a bare heartbeat). Returns the status found."""
        t = now_ms()
        counts = [items["total"], items["succeeded"], items["failed"]] if items else ["", "", ""]
        answer = self.run_script(
            "progress",
            [keys.task(task_id), keys.RUNNING, keys.events(task_id)],
            [run_id, t, "" if progress is None else int(progress), message or "", *counts, task_id],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def _transition(
        self, task_id: str, expected: tuple[str, ...], new_status: str, fields: list[Any], *,
        run_id: str = "", key_ttl: int | str = "", expiry_ms: int | str = "", result: bytes | str = "",
        drop: str = "", stale_before_ms: int | str = "", stat: str | None = None, client: Any = None,
    ) -> Transition:
        answer = self.run_script(
            "transition",
            [keys.task(task_id), keys.payload(task_id), keys.result(task_id), keys.RUNNING, keys.EXPIRY,
             keys.events(task_id), keys.STATS, keys.FAILURES, keys.ACTIVE],
            [",".join(expected), run_id, new_status, key_ttl, expiry_ms, result, self.config.result_ttl,
             drop, stale_before_ms, now_ms(), STAT_ENTERED.get(new_status, "") if stat is None else stat, task_id,
             *fields],
            client=client,
        )  # fmt: skip
        if client is not None:
            return Transition(True, "")  # queued on a pipeline: the caller reads the answer from execute()
        return Transition(answer[0] == 1, answer[1].decode())

    def _terminal(
        self, task_id: str, expected: tuple[str, ...], status: str, fields: list[Any], *,
        run_id: str = "", result: bytes | str = "", stale_before_ms: int | str = "",
    ) -> Transition:
        """Any transition into COMPLETED, FAILED or CANCELLED: the result clock starts now."""
        c = self.config
        t = now_ms()
        expires = t + c.result_ttl * 1000
        fields = [*fields, F.COMPLETED_AT, t, F.UPDATED_AT, t, F.EXPIRES_AT, expires]
        return self._transition(
            task_id, expected, status, fields, run_id=run_id, key_ttl=c.result_ttl + c.tombstone_ttl,
            expiry_ms=expires, result=result, drop="payload", stale_before_ms=stale_before_ms,
        )

    def complete(
        self, task_id: str, run_id: str, result: Any, *, items: dict[str, int] | None,
        failures: list[dict[str, Any]], error_code: int | None, message: str | None = None,
        files_run: str | None = None,
    ) -> bool:
        """PROCESSING -> COMPLETED for this run, with its result. ``files_run`` names the run whose result
        folder holds the result's files (see app.core.results). Raises ResultNotStorable, writing nothing,
        when the result is not JSON-serializable or longer than ``Config.max_result``."""
        stored: dict[str, Any] = {"result": result}
        if failures:
            stored["failures"] = failures
        if error_code is not None:
            stored["error_code"] = error_code
        if files_run is not None:
            stored["run"] = files_run
        body = self._encode_result(stored)
        fields = [F.PROGRESS, 100, F.MESSAGE, message or "completed", *_items_fields(items)]
        if len(body) <= INLINE_RESULT_MAX:
            fields += [F.RESULT, body]
            body = b""
        return self._terminal(task_id, (TaskStatus.PROCESSING,), TaskStatus.COMPLETED, fields, run_id=run_id,
                              result=body).done

    def _encode_result(self, stored: dict[str, Any]) -> bytes:
        try:
            body = orjson.dumps(stored)
        except orjson.JSONEncodeError as exc:
            raise ResultNotStorable(f"the output is not JSON-serializable: {exc}") from None
        if len(body) > self.config.max_result:
            raise ResultNotStorable(f"the output is {len(body)} bytes as JSON, over the {self.config.max_result} "
                                    "bytes limit (TASKPORT_MAX_RESULT)")
        return body

    def fail(
        self, task_id: str, run_id: str, code: int, message: str, *, items: dict[str, int] | None = None,
    ) -> bool:
        fields = [F.ERROR_CODE, code, F.ERROR_MESSAGE, message, F.MESSAGE, message, *_items_fields(items)]
        return self._terminal(task_id, (TaskStatus.PROCESSING,), TaskStatus.FAILED, fields, run_id=run_id).done

    def retry(self, task_id: str, run_id: str, message: str) -> bool:
        """PROCESSING -> PENDING: this run gave up; the job will be delivered again."""
        fields = [F.MESSAGE, message, F.UPDATED_AT, now_ms()]
        return self._transition(task_id, (TaskStatus.PROCESSING,), TaskStatus.PENDING, fields, run_id=run_id,
                                stat=STAT_RETRIED).done

    # -- client side ----------------------------------------------------------------------------
    def cancel(self, task_id: str) -> Transition:
        """PENDING|PROCESSING -> CANCELLED: done, and the status it left (or is in, when not done)."""
        return self._terminal(task_id, (TaskStatus.PENDING, TaskStatus.PROCESSING), TaskStatus.CANCELLED,
                              [F.MESSAGE, "cancelled"])

    def history(
        self, member: str, *, limit: int, cursor: str | None = None, status: str | None = None,
        type_: str | None = None, now: int | None = None,
    ) -> Page:
        """The member's tasks, newest first, filtered; ``cursor`` continues a previous page.

        A page costs at most ``1 + HISTORY_SCAN * limit`` Redis commands whatever the filter matches: one
        range read of the member's index, then one HGETALL per entry it examines (in one pipeline): at
        most ``limit`` entries unfiltered, ``HISTORY_SCAN * limit`` with a filter. So a filtered page can
        hold fewer than ``limit`` tasks, even none, with a ``next_cursor`` to go on from; it is the last
        page only when ``next_cursor`` is None. The position is (creation score, how many entries with
        that score were already passed), so tasks created meanwhile never shift a page.
        """
        now = now if now is not None else now_ms()
        top, skip = decode_cursor(cursor) if cursor else (None, 0)
        window = limit * HISTORY_SCAN if status or type_ else limit
        rows = self.redis.zrevrangebyscore(keys.history(member), "+inf" if top is None else top, "-inf",
                                           start=skip, num=window + 1, withscores=True)
        more, rows = len(rows) > window, rows[:window]
        found: list[Task] = []
        for index, ((_, score), task) in enumerate(zip(rows, self.get_many([r[0].decode() for r in rows]),
                                                       strict=True)):
            top, skip = (top, skip + 1) if score == top else (int(score), 1)
            if task and _matches(task, status, type_, now):
                found.append(task)
                if len(found) == limit:
                    more = more or index + 1 < len(rows)
                    break
        return Page(found, encode_cursor((int(top), skip)) if more and top is not None else None)

    # -- housekeeping ---------------------------------------------------------------------------
    def due(self, index: str, before_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` task ids of a sorted-set index whose score is at most ``before_ms``, oldest first."""
        return [m.decode() for m in self.redis.zrangebyscore(index, "-inf", before_ms, start=0, num=limit)]

    def expire_batch(self, task_ids: list[str], now: int) -> list[Expired]:
        """Act on tasks whose time in the expiry index has come. Returns those it expired.

        Terminal -> EXPIRED tombstone (result dropped); unfinished -> EXPIRED with -4; a tombstone whose
        time is over (or a task already gone) leaves the index. Three round trips for the whole batch.
        """
        c = self.config
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(keys.task(task_id), F.STATUS, F.JOB)
        found = pipe.execute()
        statuses = [s.decode() if s else None for s, _ in found]
        jobs = {t: job.decode() if job else t for t, (_, job) in zip(task_ids, found, strict=True)}
        tomb: dict[str, Any] = {"key_ttl": c.tombstone_ttl, "expiry_ms": now + c.tombstone_ttl * 1000, "drop": "all"}
        unfinished = [F.ERROR_CODE, ErrorCode.EXPIRED, F.ERROR_MESSAGE, ERROR_MESSAGES[ErrorCode.EXPIRED],
                      F.MESSAGE, ERROR_MESSAGES[ErrorCode.EXPIRED], F.UPDATED_AT, now]
        for task_id, status in zip(task_ids, statuses, strict=True):
            if status in TERMINAL:
                self._transition(task_id, tuple(TERMINAL), TaskStatus.EXPIRED, [F.UPDATED_AT, now], client=pipe,
                                 **tomb)
            elif status in ACTIVE:
                self._transition(task_id, tuple(ACTIVE), TaskStatus.EXPIRED, unfinished, client=pipe, **tomb)
            else:
                pipe.zrem(keys.EXPIRY, task_id)
        answers = pipe.execute()
        return [Expired(task_id, answer[1].decode(), jobs[task_id])
                for task_id, answer in zip(task_ids, answers, strict=True)
                if isinstance(answer, list) and answer[0] == 1]

    def trim_histories(self, created_before_ms: int) -> int:
        """Drop history entries of tasks old enough that they cannot exist any more."""
        members = [m.decode() for m in self.redis.smembers(keys.MEMBERS)]
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.zremrangebyscore(keys.history(member), "-inf", created_before_ms)
        return sum(pipe.execute())

    def recover(self, task: Task, stale_before_ms: int, job: Sequence[Command] = (),
                job_id: str | None = None) -> str | None:
        """Take a PROCESSING task whose heartbeat stopped: back to PENDING and re-queued (one MULTI with the
        commands ``job`` that queue RQ job ``job_id``, recorded as the task's job) while attempts remain,
        else FAILED -3. Returns the new status, or None when the task was not stalled after all (a
        heartbeat came in, or it finished)."""
        if task.attempts < task.max_attempts:
            pipe = self.redis.pipeline(transaction=True)
            fields = [F.MESSAGE, "worker lost; retrying", F.UPDATED_AT, now_ms()]
            if job_id is not None:
                fields += [F.JOB, job_id]
            self._transition(task.id, (TaskStatus.PROCESSING,), TaskStatus.PENDING, fields,
                             stale_before_ms=stale_before_ms, stat=STAT_RECOVERED, client=pipe)
            for command in job:
                pipe.execute_command(command.name, command.key, *command.args)
            return TaskStatus.PENDING if pipe.execute()[0][0] == 1 else None
        lost = ERROR_MESSAGES[ErrorCode.WORKER_LOST]
        failed: list[Any] = [F.ERROR_CODE, ErrorCode.WORKER_LOST, F.ERROR_MESSAGE, lost, F.MESSAGE, lost]
        done = self._terminal(task.id, (TaskStatus.PROCESSING,), TaskStatus.FAILED, failed,
                              stale_before_ms=stale_before_ms).done
        return TaskStatus.FAILED if done else None

    def job_id(self, task_id: str) -> str:
        """The id of the task's current RQ job: the task id, unless a recovery re-queued it under another."""
        job = self.redis.hget(keys.task(task_id), F.JOB)
        return job.decode() if job else task_id

    def forget_running(self, task_id: str) -> None:
        """Drop a task from the running index (it is not PROCESSING any more, or gone)."""
        self.redis.zrem(keys.RUNNING, task_id)

    def take_lock(self, key: str, ttl_ms: int, value: int | None = None) -> bool:
        """SET NX with a lifetime: True when this caller took ``key`` (a housekeeping pass's interval lock,
        the failure alert's window), False when someone holds it."""
        return bool(self.redis.set(key, now_ms() if value is None else value, nx=True, px=ttl_ms))

    def slow_warned(self) -> set[str]:
        """The PROCESSING tasks already logged as slow."""
        return {m.decode() for m in self.redis.smembers(keys.SLOW_WARNED)}

    def mark_slow(self, task_id: str) -> None:
        self.redis.sadd(keys.SLOW_WARNED, task_id)

    def unmark_slow(self, *task_ids: str) -> None:
        self.redis.srem(keys.SLOW_WARNED, *task_ids)

    def failures_since(self, start_ms: int) -> int:
        """How many tasks failed since ``start_ms``; older entries leave the index (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(keys.FAILURES, "-inf", f"({start_ms}")
        pipe.zcard(keys.FAILURES)
        return int(pipe.execute()[1])

    def orphan_sweep_position(self) -> str:
        """The task id the result store's orphan sweep continues after ('' = from the start)."""
        return (self.redis.get(keys.ORPHAN_SWEEP) or b"").decode()

    def set_orphan_sweep_position(self, task_id: str) -> None:
        self.redis.set(keys.ORPHAN_SWEEP, task_id)

    def running(self, limit: int = 10_000) -> list[str]:
        return [m.decode() for m in self.redis.zrange(keys.RUNNING, 0, limit - 1)]

    def active(self, member: str) -> int:
        """How many of the member's tasks are unfinished (the count the submit script checks its cap against)."""
        return int(self.redis.hget(keys.ACTIVE, member) or 0)

    def count(self, stat: str, n: int = 1) -> None:
        """Add ``n`` to the ``keys.STATS`` counter ``stat``."""
        self.redis.hincrby(keys.STATS, stat, n)

    # -- event streams (web processes) ----------------------------------------------------------------
    def subscribe_task_events(self) -> redis.client.PubSub:
        """A pub/sub connection subscribed to every task's events channel (the caller closes it)."""
        pubsub = self.redis.pubsub()
        pubsub.psubscribe(keys.events("*"))
        return pubsub

    def open_stream_slot(self, member: str, slot: str) -> int:
        """Count an open event stream of ``member`` (leased for ``keys.STREAM_LEASE_MS``, expired leases
        dropped first); returns how many the member holds now, this one included (one transaction)."""
        now = now_ms()
        key = keys.streams(member)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", now)  # leases of processes that died without releasing
        pipe.zadd(key, {slot: now + keys.STREAM_LEASE_MS})
        pipe.zcard(key)
        pipe.pexpire(key, keys.STREAM_LEASE_MS)
        return int(pipe.execute()[2])

    def close_stream_slot(self, member: str, slot: str) -> None:
        self.redis.zrem(keys.streams(member), slot)

    def renew_stream_slots(self, held: list[tuple[str, str]]) -> None:
        """Push the lease of each (slot, member) still counted (one round trip)."""
        until = now_ms() + keys.STREAM_LEASE_MS
        pipe = self.redis.pipeline(transaction=False)
        for slot, member in held:
            pipe.zadd(keys.streams(member), {slot: until}, xx=True)  # XX: never revive a slot released meanwhile
        for member in {m for _, m in held}:
            pipe.pexpire(keys.streams(member), keys.STREAM_LEASE_MS)
        pipe.execute()

    def audit_trail(self, *, task_id: str | None, member: str | None, limit: int,
                    cursor: str | None) -> audit.AuditPage:
        """A page of the audit trail, newest first (see :func:`app.core.audit.read`)."""
        return audit.read(self.redis, task_id=task_id, member=member, limit=limit, cursor=cursor)

    def stats(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    """A hash from a script's HGETALL reply (a flat list: field, value, ...)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


_RESULT = F.RESULT.encode()


def _matches(task: Task, status: str | None, type_: str | None, now: int) -> bool:
    return (not status or task.effective_status(now) == status) and (not type_ or task.type == type_)


# A history cursor: "<creation time in ms>-<entries with that time already passed>", in ASCII digits within
# bounds Redis accepts (its LIMIT offset is a signed 64-bit integer; a score a double). Clients treat it as
# opaque; the OpenAPI document states this exact pattern, so every string it allows is a cursor we accept.
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,15})-(0|[1-9][0-9]{0,9})$"
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(position: tuple[float, int]) -> str:
    return f"{int(position[0])}-{int(position[1])}"


def decode_cursor(cursor: str) -> tuple[int, int]:
    """Raises ValueError for anything that is not a cursor this service made."""
    match = _CURSOR.match(cursor) if len(cursor) <= 64 and cursor.isascii() and "\n" not in cursor else None
    if match is None:
        raise ValueError("malformed cursor")
    return int(match[1]), int(match[2])
