"""TaskStore: every read and write of a task's Redis data goes through here.

Writes are the Lua scripts of :mod:`app.scripts` (one atomic compare-and-set each); reads are one
round trip (HGETALL, or a pipeline when the result is needed too).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from app import keys, scripts
from app.config import Config
from app.states import ACTIVE, ERROR_MESSAGES, TERMINAL, ErrorCode, TaskStatus
from app.task import Task, now_ms

S = TaskStatus


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


@dataclass(frozen=True)
class Started:
    """What a worker needs once it owns a task."""

    task: Task
    payload: dict[str, Any]


@dataclass(frozen=True)
class Page:
    tasks: list[Task]
    next_cursor: str | None


def _items_fields(items: dict[str, int] | None) -> list[Any]:
    if items is None:
        return []
    return ["items_total", items["total"], "items_succeeded", items["succeeded"], "items_failed", items["failed"]]


class TaskStore:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.redis: Any = conn  # redis-py's bytes|str unions say nothing here: replies are bytes (no decoding)
        self.config = config
        self._sources = scripts.build(*config.audit_limits)  # the audit retention is rendered into the scripts
        self._scripts = {name: conn.register_script(src) for name, src in self._sources.items()}

    def _run(self, name: str, keys_: list[str], args: list[Any], client: Any = None) -> Any:
        """Run a script now (EVALSHA, loading it on NOSCRIPT), or queue it on a caller's pipeline.

        On a pipeline it goes as EVAL with its source: an EVALSHA that met an empty script cache (a
        restarted Redis) would fail inside MULTI while the rest of the transaction still applied, and
        redis-py's own remedy costs a SCRIPT EXISTS round trip on every execute.
        """
        keys_ = [*keys_, keys.AUDIT]  # every script's last key: see scripts.AUDIT
        if client is None:
            return self._scripts[name](keys=keys_, args=args)
        return client.eval(self._sources[name], len(keys_), *keys_, *args)

    # -- submit ---------------------------------------------------------------------------------
    def create(self, new: NewTask, enqueue: Callable[[Any], None]) -> tuple[bool, str, Task | None]:
        """Create the task and queue its job, unless its dedup key is held: one script, one round trip.
        Raises ActiveCapReached, writing nothing, when the member holds ``Config.active_task_cap``
        unfinished tasks already.

        ``enqueue(pipeline)`` is RQ's own enqueue of the job; its commands are recorded on a pipeline
        that is never sent, and the submit script replays them once it has created the task, so a
        duplicate queues nothing. Returns (created, id of the task holding the key, the new task as
        written or None).
        """
        c = self.config
        created = now_ms()
        body = orjson.dumps(new.payload)
        fields = [
            "type", new.type, "member", new.member, "status", S.PENDING,
            "progress", 0, "attempts", 0, "max_attempts", new.max_attempts, "priority", new.priority,
            "created_at", created, "updated_at", created, "expires_at", created + c.task_ttl * 1000, "seq", 0,
            "payload_sha256", base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode(),
        ]  # fmt: skip
        job_keys, job_args = self._recorded_job(enqueue)
        key_ttl = c.task_ttl + c.tombstone_ttl
        answer = self._run(
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
            return True, new.task_id, Task.from_hash(written, new.task_id)
        return False, answer[1].decode(), None

    def _recorded_job(self, enqueue: Callable[[Any], None]) -> tuple[list[Any], list[Any]]:
        """The commands ``enqueue`` issues on a pipeline, as (their keys, [name, argc, args...] each)."""
        recorder = self.redis.pipeline(transaction=True)
        recorder.multi()  # as RQ expects of a caller's pipeline; nothing is ever sent
        enqueue(recorder)
        job_keys: list[Any] = []
        job_args: list[Any] = []
        for args, _options in recorder.command_stack:
            name, key, *rest = args
            job_keys.append(key)
            job_args += [name, len(rest), *rest]
        recorder.reset()
        return job_keys, job_args

    # -- reads ----------------------------------------------------------------------------------
    def get(self, task_id: str) -> Task | None:
        h = self.redis.hgetall(keys.task(task_id))
        return Task.from_hash(h, task_id) if h else None

    def get_with_result(self, task_id: str) -> tuple[Task | None, dict[str, Any] | None]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.task(task_id))
        pipe.get(keys.result(task_id))
        h, raw = pipe.execute()
        if not h:
            return None, None
        raw = h.get(b"result") or raw
        return Task.from_hash(h, task_id), (orjson.loads(raw) if raw else None)

    def get_many(self, task_ids: list[str]) -> list[Task | None]:
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hgetall(keys.task(task_id))
        return [Task.from_hash(h, t) if h else None for h, t in zip(pipe.execute(), task_ids, strict=True)]

    # -- worker side ----------------------------------------------------------------------------
    def start(self, task_id: str, run_id: str) -> Started | str:
        """PENDING -> PROCESSING for this run. Returns Started, or the status that prevented it."""
        t = now_ms()
        answer = self._run(
            "start",
            [keys.task(task_id), keys.payload(task_id), keys.RUNNING, keys.events(task_id)],
            [run_id, t, task_id],
        )
        if answer[0] != 1:
            return answer[1].decode()
        flat = answer[2]
        h = dict(zip(flat[::2], flat[1::2], strict=True))
        return Started(task=Task.from_hash(h, task_id), payload=orjson.loads(answer[1]))

    def report(
        self, task_id: str, run_id: str, progress: int | None, message: str | None = None,
        items: dict[str, int] | None = None,
    ) -> str:
        """Progress (or, with progress None, a bare heartbeat). Returns the status found."""
        t = now_ms()
        counts = [items["total"], items["succeeded"], items["failed"]] if items else ["", "", ""]
        answer = self._run(
            "progress",
            [keys.task(task_id), keys.RUNNING, keys.events(task_id)],
            [run_id, t, "" if progress is None else int(progress), message or "", *counts, task_id],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def _transition(
        self, task_id: str, expected: tuple[str, ...], new_status: str, fields: list[Any], *,
        run_id: str = "", key_ttl: int | str = "", expiry_ms: int | str = "", result: bytes | str = "",
        drop: str = "", stale_before_ms: int | str = "", stat: str | None = None, client: Any = None,
    ) -> tuple[bool, str]:
        answer = self._run(
            "transition",
            [keys.task(task_id), keys.payload(task_id), keys.result(task_id), keys.RUNNING, keys.EXPIRY,
             keys.events(task_id), keys.STATS, keys.FAILURES, keys.ACTIVE],
            [",".join(expected), run_id, new_status, key_ttl, expiry_ms, result, self.config.result_ttl,
             drop, stale_before_ms, now_ms(), new_status.lower() if stat is None else stat, task_id, *fields],
            client=client,
        )  # fmt: skip
        if client is not None:
            return True, ""  # queued on a pipeline: the caller reads the answer from execute()
        return answer[0] == 1, answer[1].decode()

    def _terminal(
        self, task_id: str, expected: tuple[str, ...], status: str, fields: list[Any], *,
        run_id: str = "", result: bytes | str = "", stale_before_ms: int | str = "",
    ) -> tuple[bool, str]:
        """Any transition into COMPLETED, FAILED or CANCELLED: the result clock starts now."""
        c = self.config
        t = now_ms()
        expires = t + c.result_ttl * 1000
        fields = [*fields, "completed_at", t, "updated_at", t, "expires_at", expires]
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
        folder holds the result's files (see app.results). Raises ResultNotStorable, writing nothing,
        when the result is not JSON-serializable or longer than ``Config.max_result``."""
        stored: dict[str, Any] = {"result": result}
        if failures:
            stored["failures"] = failures
        if error_code is not None:
            stored["error_code"] = error_code
        if files_run is not None:
            stored["run"] = files_run
        body = self._encode_result(stored)
        fields = ["progress", 100, "message", message or "completed", *_items_fields(items)]
        if len(body) <= INLINE_RESULT_MAX:
            fields += ["result", body]
            body = b""
        ok, _ = self._terminal(task_id, (S.PROCESSING,), S.COMPLETED, fields, run_id=run_id, result=body)
        return ok

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
        fields = ["error_code", code, "error_message", message, "message", message, *_items_fields(items)]
        ok, _ = self._terminal(task_id, (S.PROCESSING,), S.FAILED, fields, run_id=run_id)
        return ok

    def retry(self, task_id: str, run_id: str, message: str) -> bool:
        """PROCESSING -> PENDING: this run gave up; the job will be delivered again."""
        fields = ["message", message, "updated_at", now_ms()]
        ok, _ = self._transition(task_id, (S.PROCESSING,), S.PENDING, fields, run_id=run_id, stat="retried")
        return ok

    # -- client side ----------------------------------------------------------------------------
    def cancel(self, task_id: str) -> tuple[bool, str]:
        """PENDING|PROCESSING -> CANCELLED. Returns (done, previous or current status)."""
        return self._terminal(task_id, (S.PENDING, S.PROCESSING), S.CANCELLED, ["message", "cancelled"])

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

    def expire_batch(self, task_ids: list[str], now: int) -> list[tuple[str, str, str]]:
        """Act on tasks whose time in the expiry index has come. Returns (task_id, status it left, its RQ
        job id).

        Terminal -> EXPIRED tombstone (result dropped); unfinished -> EXPIRED with -4; a tombstone whose
        time is over (or a task already gone) leaves the index. Three round trips for the whole batch.
        """
        c = self.config
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(keys.task(task_id), "status", "job")
        found = pipe.execute()
        statuses = [s.decode() if s else None for s, _ in found]
        jobs = {t: job.decode() if job else t for t, (_, job) in zip(task_ids, found, strict=True)}
        tomb: dict[str, Any] = {"key_ttl": c.tombstone_ttl, "expiry_ms": now + c.tombstone_ttl * 1000, "drop": "all"}
        unfinished = ["error_code", ErrorCode.EXPIRED, "error_message", ERROR_MESSAGES[ErrorCode.EXPIRED],
                      "message", ERROR_MESSAGES[ErrorCode.EXPIRED], "updated_at", now]
        for task_id, status in zip(task_ids, statuses, strict=True):
            if status in TERMINAL:
                self._transition(task_id, tuple(TERMINAL), S.EXPIRED, ["updated_at", now], client=pipe, **tomb)
            elif status in ACTIVE:
                self._transition(task_id, tuple(ACTIVE), S.EXPIRED, unfinished, client=pipe, **tomb)
            else:
                pipe.zrem(keys.EXPIRY, task_id)
        answers = pipe.execute()
        return [(task_id, answer[1].decode(), jobs[task_id]) for task_id, answer in zip(task_ids, answers, strict=True)
                if isinstance(answer, list) and answer[0] == 1]

    def trim_histories(self, created_before_ms: int) -> int:
        """Drop history entries of tasks old enough that they cannot exist any more."""
        members = [m.decode() for m in self.redis.smembers(keys.MEMBERS)]
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.zremrangebyscore(keys.history(member), "-inf", created_before_ms)
        return sum(pipe.execute())

    def recover(self, task: Task, stale_before_ms: int, requeue: Any, job_id: str | None = None) -> str | None:
        """Take a PROCESSING task whose heartbeat stopped: back to PENDING and re-queued (one MULTI with
        ``requeue(pipeline)``, which queues RQ job ``job_id``, recorded as the task's job) while attempts
        remain, else FAILED -3. Returns the new status, or None when the task was not stalled after all
        (a heartbeat came in, or it finished)."""
        if task.attempts < task.max_attempts:
            pipe = self.redis.pipeline(transaction=True)
            pipe.multi()  # explicit, as RQ's enqueue expects of a caller's pipeline
            fields = ["message", "worker lost; retrying", "updated_at", now_ms()]
            if job_id is not None:
                fields += ["job", job_id]
            self._transition(task.id, (S.PROCESSING,), S.PENDING, fields, stale_before_ms=stale_before_ms,
                             stat="recovered", client=pipe)
            requeue(pipe)
            return S.PENDING if pipe.execute()[0][0] == 1 else None
        lost = ERROR_MESSAGES[ErrorCode.WORKER_LOST]
        failed: list[Any] = ["error_code", ErrorCode.WORKER_LOST, "error_message", lost, "message", lost]
        ok, _ = self._terminal(task.id, (S.PROCESSING,), S.FAILED, failed, stale_before_ms=stale_before_ms)
        return S.FAILED if ok else None

    def job_id(self, task_id: str) -> str:
        """The id of the task's current RQ job: the task id, unless a recovery re-queued it under another."""
        job = self.redis.hget(keys.task(task_id), "job")
        return job.decode() if job else task_id

    def running(self, limit: int = 10_000) -> list[str]:
        return [m.decode() for m in self.redis.zrange(keys.RUNNING, 0, limit - 1)]

    def active(self, member: str) -> int:
        """How many of the member's tasks are unfinished (the count the submit script checks its cap against)."""
        return int(self.redis.hget(keys.ACTIVE, member) or 0)

    def stats(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}


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
