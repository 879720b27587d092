"""TaskStore: every read and write of a task's own keys goes through here.

A task's own keys are its hash, payload, result and events channel (``keys.task`` and the builders beside
it). Writes are the Lua scripts of :mod:`app.core.scripts` (one atomic compare-and-set each, which
also keeps the shared indexes and counters); reads are one round trip (HGETALL, or a pipeline when the
result is needed too). The shared keys have owners of their own: the indexes housekeeping reads in
:mod:`app.core.indexes`, the member histories in :mod:`app.core.history`, the counters in
:mod:`app.core.stats`, the audit trail in :mod:`app.core.audit`.

The store is built in layers: :class:`app.core.scriptstore.ScriptStore` loads and runs the scripts (the one
seam every write takes) and makes the TRANSITION call, :class:`app.core.runstore.RunStore` holds a run's writes
(start, progress, its end, recovery), and TaskStore adds the submit, the reads, the cancel and the expiry.

With TASKPORT_REPLICA_ACK the writes a caller is told about (submit, cancel, every terminal transition)
are followed by ``WAIT 1`` on the same connection: answered once a replica has them, else
:class:`app.core.connection.NoReplicaError` (the web's 503), so a failover cannot drop what was acknowledged.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import orjson

from app.core import keys, lua, scripts
from app.core.answers import ActiveCapReached, Created, Expired, NewTask, StoredBytesReached, Transition, WithResult
from app.core.clock import now_ms
from app.core.config import Config
from app.core.creation import CREATED_HEAD
from app.core.ids import digest
from app.core.indexes import ExpiryIndex
from app.core.jobs import FirstJob
from app.core.keys import TaskField as F
from app.core.lua import Command
from app.core.runstore import RunStore
from app.core.scriptstore import pairs
from app.core.states import ACTIVE, ERROR_MESSAGES, TERMINAL, ErrorCode, TaskStatus
from app.core.task import UNWRITTEN_DEFAULTS, Task


class _SubmitSettings(NamedTuple):
    config: Config  # the one they were read from
    dedup_window: int
    key_ttl: int  # task_ttl + tombstone_ttl (s), before a run_at's wait
    ttl_ms: int  # task_ttl in ms
    cap: int  # active_task_cap
    bytes_cap: int  # stored_bytes_cap
    record_ms: int  # call_record_ms
    lapse_check: str  # "1" when the dedup window is shorter than a call's record (the SUBMIT script's check)


class TaskStore(RunStore):
    # -- submit ---------------------------------------------------------------------------------
    def create(self, new: NewTask, job: Sequence[Command] | FirstJob = (), *, run_at: int | None = None,
               after: Sequence[str] = ()) -> Created:
        """Create the task and queue its job, unless its dedup key is held: one script, one round trip,
        a duplicate included (the script answers with the holder's record). Raises ActiveCapReached,
        writing nothing, when the member holds ``Config.active_task_cap`` unfinished tasks already.

        ``job`` is the commands that queue the task's RQ job (:meth:`app.core.jobs.JobQueue.job_commands`): the
        submit script replays them once it has created the task, so a duplicate queues nothing (tests
        that start tasks by hand pass none), or a submit's first job as its queue's template in the script takes it
        (:meth:`app.core.jobs.JobQueue.first_job`: the same commands, ~5 arguments instead of ~59). ``run_at`` (ms)
        ahead of now: the task waits in ``keys.DELAYED`` unqueued, its lifetime counted from then. ``after``: the ids
        of tasks it runs after (checked to be the member's by the caller); it waits for those not COMPLETED (the
        created task's ``waiting_for``), and when one of them ended otherwise its id is the created task's
        ``ended_dep``.
        """
        s = self._submit_settings()
        created = now_ms()
        start, fields, body = self.task_fields(new, created, run_at)
        job_args: list[Any] = []
        template: dict[str, Any]
        if isinstance(job, FirstJob):
            job_keys = job.keys
            template = {"job_queue": job.queue, "job_at": job.at, "job_data": job.data, "job_timeout": job.timeout,
                        "job_weight": job.weight}
        else:
            job_keys, job_args = lua.replay(job)
            template = _NO_TEMPLATE
        dep_keys = [key for dep in after for key in (keys.task(dep), keys.dependents(dep))]
        answer = self.run_script(scripts.SUBMIT.name, *scripts.SUBMIT.call(
            keys={"dedup": keys.dedup(new.member, new.dedup_digest), "task": keys.task(new.task_id),
                  "payload": keys.payload(new.task_id), "history": keys.history(new.member), "expiry": keys.EXPIRY,
                  "members": keys.MEMBERS, "stats": keys.STATS, "active": keys.ACTIVE, "delayed": keys.DELAYED,
                  "settled": keys.SETTLED, "stored_bytes": keys.STORED_BYTES, "waiting_tasks": keys.WAITING},
            args={"task_id": new.task_id, "dedup_window_s": s.dedup_window,
                  "key_ttl_s": s.key_ttl + (start - created) // 1000,
                  "created_ms": created, "expiry_ms": start + s.ttl_ms, "payload_json": body,
                  "member": new.member, "cap": s.cap, "bytes_cap": s.bytes_cap,
                  "job_argc": len(job_args),
                  "run_at_ms": start if start > created else "", "after_ids": ",".join(after),
                  "lapse_check": s.lapse_check, **template},
            rest_keys=[*dep_keys, *job_keys], rest=[*job_args, *fields], record_ms=s.record_ms,
        ), acknowledged=True)  # fmt: skip
        if answer[0] == 2:
            raise ActiveCapReached(s.cap, int(answer[1]))
        if answer[0] == 3:
            raise StoredBytesReached(s.bytes_cap, int(answer[1]))
        if answer[0] == 1:
            if answer[1]:  # a task it runs after ended otherwise already: FAILED -6 now (the settle tick's backstop)
                self.fail_waiting(new.task_id, answer[1].decode())
                return Created(True, new.task_id, self.get(new.task_id))
            return Created(True, new.task_id, Task.created(
                new.task_id, new.type, new.member, new.priority, new.max_attempts, created, start + s.ttl_ms,
                run_at, fields[_DIGEST_AT], waiting_for=answer[2].decode(), batch=new.batch, then_of=new.then_of,
                callback=bool(new.callback_url)))  # what it wrote, as from_hash would read it back
        holder = answer[1].decode()
        return Created(False, holder, Task.from_hash(pairs(answer[2]), holder) if answer[2] else None)

    _settings: _SubmitSettings | None = None

    def _submit_settings(self) -> _SubmitSettings:
        """What a submit reads of the config, worked out once per Config (frozen): the caps and the record's time
        are properties that parse or compute on every read (~1 µs a submit)."""
        c = self.config
        settings = self._settings
        if settings is None or settings.config is not c:
            settings = self._settings = _SubmitSettings(
                c, c.dedup_window, c.task_ttl + c.tombstone_ttl, c.task_ttl * 1000, c.active_task_cap,
                c.stored_bytes_cap, c.call_record_ms, "1" if c.dedup_window * 1000 < c.call_record_ms else "")
        return settings

    def task_fields(self, new: NewTask, created: int, run_at: int | None) -> tuple[int, list[Any], bytes]:
        """A new task's start (its run_at, or its creation: its lifetime counts from it), its hash's field pairs
        and its payload's JSON: what a submit and a batch create write."""
        c = self.config
        start = max(created, run_at or 0)
        body = orjson.dumps(new.payload)
        # The fields' names from module constants (CREATED_HEAD's, in its order, and _F's): each ``F.NAME`` is an
        # enum class's attribute read, ~50 ns on Python 3.11, a dozen a submit.
        type_, member, status, progress, attempts, created_at, updated_at, expires_at, seq, sha256 = CREATED_HEAD
        fields = [
            type_, new.type, member, new.member, status, _PENDING, progress, 0, attempts, 0, created_at, created,
            updated_at, created, expires_at, start + c.task_ttl * 1000, seq, 0, sha256, digest(body), _F.STORED,
            len(body), *([_F.RUN_AT, run_at] if run_at is not None else []),
        ]  # fmt: skip
        if new.max_attempts != _UNWRITTEN_MAX_ATTEMPTS:  # UNWRITTEN_DEFAULTS's, read once: a member's hash is
            fields += [_F.MAX_ATTEMPTS, new.max_attempts]  # a Python-level call (~0.2 µs each, per submit)
        if new.priority != _UNWRITTEN_PRIORITY:
            fields += [_F.PRIORITY, new.priority]
        if new.traceparent:
            fields += [_F.TRACEPARENT, new.traceparent]
        if new.callback_url:
            fields += [_F.CALLBACK_URL, new.callback_url, _F.CALLBACK_EVENTS, ",".join(new.callback_events)]
        if new.batch:
            fields += [_F.BATCH, new.batch]
        if new.then_of:
            fields += [_F.THEN_OF, new.then_of]
        return start, fields, body

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

    # -- dependencies ---------------------------------------------------------------------------
    def fail_waiting(self, task_id: str, dep_id: str) -> bool:
        """PENDING -> FAILED -6 for a task that runs after ``dep_id``, which ended otherwise than COMPLETED (or is
        gone): only while the task still waits for it, so the news is acted on once. The message names it."""
        found = self.redis.hget(keys.task(dep_id), F.STATUS)
        why = f"{ERROR_MESSAGES[ErrorCode.DEPENDENCY]}: {dep_id} is {found.decode() if found else TaskStatus.EXPIRED}"
        fields = [F.ERROR_CODE, ErrorCode.DEPENDENCY, F.ERROR_MESSAGE, why, F.MESSAGE, why]
        return self._terminal(task_id, (TaskStatus.PENDING,), TaskStatus.FAILED, fields, waiting_on=dep_id).done

    # -- client side ----------------------------------------------------------------------------
    def cancel(self, task_id: str) -> Transition:
        """PENDING|PROCESSING -> CANCELLED: done, and the status it left (or is in, when not done)."""
        return self._terminal(task_id, (TaskStatus.PENDING, TaskStatus.PROCESSING), TaskStatus.CANCELLED,
                              [F.MESSAGE, "cancelled"])

    # -- housekeeping ---------------------------------------------------------------------------
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
        jobs = {t: job_of(t, job) for t, (_, job) in zip(task_ids, found, strict=True)}
        tomb: dict[str, Any] = {"key_ttl": c.tombstone_ttl, "expiry_ms": now + c.tombstone_ttl * 1000, "drop": "all"}
        unfinished = [F.ERROR_CODE, ErrorCode.EXPIRED, F.ERROR_MESSAGE, ERROR_MESSAGES[ErrorCode.EXPIRED],
                      F.MESSAGE, ERROR_MESSAGES[ErrorCode.EXPIRED], F.UPDATED_AT, now]
        expiry = ExpiryIndex(self.redis)
        for task_id, status in zip(task_ids, statuses, strict=True):
            if status in TERMINAL:
                self._transition(task_id, tuple(TERMINAL), TaskStatus.EXPIRED, [F.UPDATED_AT, now], client=pipe,
                                 **tomb)
            elif status in ACTIVE:
                self._transition(task_id, tuple(ACTIVE), TaskStatus.EXPIRED, unfinished, client=pipe, **tomb)
            else:
                expiry.forget(task_id, pipeline=pipe)
        answers = pipe.execute()
        return [Expired(task_id, answer[1].decode(), jobs[task_id])
                for task_id, answer in zip(task_ids, answers, strict=True)
                if isinstance(answer, list) and answer[0] == 1]

    def job_id(self, task_id: str) -> str:
        """The id of the task's current RQ job: the task id, unless a recovery re-queued it under another."""
        return job_of(task_id, self.redis.hget(keys.task(task_id), F.JOB))  # type: ignore[arg-type]


def job_of(task_id: str, job: bytes | None) -> str:
    """The id of the task's current RQ job from its hash's ``job`` field as read: the task id when the field is
    absent (no recovery re-queued it under another)."""
    return job.decode() if job else task_id


_RESULT = F.RESULT.encode()
_F = SimpleNamespace(**{field.name: field for field in F})  # F's members, plain attributes
_PENDING = TaskStatus.PENDING
_UNWRITTEN_MAX_ATTEMPTS = UNWRITTEN_DEFAULTS[F.MAX_ATTEMPTS]
_UNWRITTEN_PRIORITY = UNWRITTEN_DEFAULTS[F.PRIORITY]
_NO_TEMPLATE = {"job_queue": "", "job_at": "", "job_data": "", "job_timeout": "", "job_weight": ""}
_DIGEST_AT = 2 * CREATED_HEAD.index(F.PAYLOAD_SHA256) + 1  # the payload's digest in task_fields' list
