"""TaskStore: every read and write of a task's own keys goes through here.

A task's own keys are its hash, payload, result and events channel (``keys.task`` and the builders beside
it). Writes are the Lua scripts of :mod:`app.core.scripts` (one atomic compare-and-set each, which
also keeps the shared indexes and counters); reads are one round trip (HGETALL, or a pipeline when the
result is needed too). The shared keys have owners of their own: the indexes housekeeping reads in
:mod:`app.core.indexes`, the member histories in :mod:`app.core.history`, the counters in
:mod:`app.core.stats`, the audit trail in :mod:`app.core.audit`.

With TASKPORT_REPLICA_ACK the writes a caller is told about (submit, cancel, every terminal transition)
are followed by ``WAIT 1`` on the same connection: answered once a replica has them, else
:class:`app.core.connection.NoReplicaError` (the web's 503), so a failover cannot drop what was acknowledged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import redis

from app.core import keys, lua, runscripts, scripts
from app.core.answers import (
    ActiveCapReached,
    Claim,
    Created,
    Expired,
    NewTask,
    ResultNotStorable,
    Started,
    StoredBytesReached,
    Transition,
    WithResult,
)
from app.core.clock import now_ms
from app.core.config import Config
from app.core.connection import NoReplicaError
from app.core.ids import digest
from app.core.indexes import ExpiryIndex
from app.core.keys import STAT_ENTERED, STAT_INTERRUPTED, STAT_RECOVERED, STAT_RETRIED
from app.core.keys import TaskField as F
from app.core.lua import Command
from app.core.states import ACTIVE, ERROR_MESSAGES, RERUNNABLE, TERMINAL, ErrorCode, TaskStatus
from app.core.task import UNWRITTEN_DEFAULTS, Task

# A result whose JSON is at most this long lives in the task's hash instead of a key of its own: Redis
# keeps a hash compact (ziplist/listpack) while every value is within hash-max-ziplist-value (64 by
# default), and a key of its own costs more than a hundred bytes of bookkeeping.
INLINE_RESULT_MAX = 64
REPLICAS_ACKING = 1  # replicas that must have a write before TASKPORT_REPLICA_ACK acknowledges it


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

    def run_script(self, name: str, keys_: list[str], args: list[Any], client: Any = None, *,
                   acknowledged: bool = False) -> Any:
        """Run a script now (EVALSHA, loading it on NOSCRIPT), or queue it on a caller's pipeline.

        On a pipeline it goes as EVAL with its source: an EVALSHA that met an empty script cache (a
        restarted Redis) would fail inside MULTI while the rest of the transaction still applied, and
        redis-py's own remedy costs a SCRIPT EXISTS round trip on every execute. Every write of the
        store goes through here: the one seam a subclass overrides to send them its own way
        (bench.fill batches them on a pipeline). ``acknowledged``: a caller is told of this write, so
        under TASKPORT_REPLICA_ACK it returns only once a replica has it.
        """
        keys_ = [*keys_, keys.AUDIT]  # every script's last key: lua.AUDIT_STREAM
        if client is not None:
            return client.eval(self._sources[name], len(keys_), *keys_, *args)
        if acknowledged and self.config.replica_ack:
            return self._replicated(name, keys_, args)
        return self._scripts[name](keys=keys_, args=args)

    def _replicated(self, name: str, keys_: list[str], args: list[Any]) -> Any:
        """The script, then WAIT on the same connection (WAIT counts that connection's writes): one round
        trip. A script cache emptied by a failover (the new primary's) is loaded once and the call repeated."""
        script = self._scripts[name]
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys_), *keys_, *args)
            pipe.wait(REPLICAS_ACKING, int(self.config.redis_timeout * 500))  # ms: half the socket timeout
            answer, replicas = pipe.execute(raise_on_error=False)
            if not isinstance(answer, redis.exceptions.NoScriptError):
                break
            self.redis.script_load(self._sources[name])
        for reply in (answer, replicas):
            if isinstance(reply, Exception):
                raise reply
        if replicas < REPLICAS_ACKING:
            raise NoReplicaError(f"the write reached {replicas} replicas, TASKPORT_REPLICA_ACK needs {REPLICAS_ACKING}")
        return answer

    # -- submit ---------------------------------------------------------------------------------
    def create(self, new: NewTask, job: Sequence[Command] = (), *, run_at: int | None = None,
               after: Sequence[str] = ()) -> Created:
        """Create the task and queue its job, unless its dedup key is held: one script, one round trip,
        a duplicate included (the script answers with the holder's record). Raises ActiveCapReached,
        writing nothing, when the member holds ``Config.active_task_cap`` unfinished tasks already.

        ``job`` is the commands that queue the task's RQ job (:meth:`app.core.jobs.JobQueue.job_commands`): the
        submit script replays them once it has created the task, so a duplicate queues nothing (tests
        that start tasks by hand pass none). ``run_at`` (ms) ahead of now: the task waits in ``keys.DELAYED``
        unqueued, its lifetime counted from then. ``after``: the ids of tasks it runs after (checked to be
        the member's by the caller); it waits for those not COMPLETED (the created task's ``waiting_for``),
        and when one of them ended otherwise its id is the created task's ``ended_dep``.
        """
        c = self.config
        created = now_ms()
        start, fields, body = self.task_fields(new, created, run_at)
        job_keys, job_args = lua.replay(job)
        dep_keys = [key for dep in after for key in (keys.task(dep), keys.dependents(dep))]
        answer = self.run_script(scripts.SUBMIT.name, *scripts.SUBMIT.call(
            keys={"dedup": keys.dedup(new.member, new.dedup_digest), "task": keys.task(new.task_id),
                  "payload": keys.payload(new.task_id), "history": keys.history(new.member), "expiry": keys.EXPIRY,
                  "members": keys.MEMBERS, "stats": keys.STATS, "active": keys.ACTIVE, "delayed": keys.DELAYED,
                  "settled": keys.SETTLED, "stored_bytes": keys.STORED_BYTES, "waiting_tasks": keys.WAITING},
            args={"task_id": new.task_id, "dedup_window_s": c.dedup_window,
                  "key_ttl_s": c.task_ttl + c.tombstone_ttl + (start - created) // 1000,
                  "created_ms": created, "expiry_ms": start + c.task_ttl * 1000, "payload_json": body,
                  "member": new.member, "cap": c.active_task_cap, "bytes_cap": c.stored_bytes_cap,
                  "job_argc": len(job_args),
                  "run_at_ms": start if start > created else "", "after_ids": ",".join(after)},
            rest_keys=[*dep_keys, *job_keys], rest=[*job_args, *fields], record_ms=c.call_record_ms,
        ), acknowledged=True)  # fmt: skip
        if answer[0] == 2:
            raise ActiveCapReached(c.active_task_cap, int(answer[1]))
        if answer[0] == 3:
            raise StoredBytesReached(c.stored_bytes_cap, int(answer[1]))
        if answer[0] == 1:
            written = {str(k).encode(): str(v).encode() for k, v in zip(fields[::2], fields[1::2], strict=True)}
            if answer[2]:
                written[F.WAITING_FOR.encode()] = answer[2]
            if answer[1]:  # a task it runs after ended otherwise already: FAILED -6 now (the settle tick's backstop)
                self.fail_waiting(new.task_id, answer[1].decode())
                return Created(True, new.task_id, self.get(new.task_id))
            return Created(True, new.task_id, Task.from_hash(written, new.task_id))
        holder = answer[1].decode()
        return Created(False, holder, Task.from_hash(_pairs(answer[2]), holder) if answer[2] else None)

    def task_fields(self, new: NewTask, created: int, run_at: int | None) -> tuple[int, list[Any], bytes]:
        """A new task's start (its run_at, or its creation: its lifetime counts from it), its hash's field pairs
        and its payload's JSON: what a submit and a batch create write."""
        c = self.config
        start = max(created, run_at or 0)
        body = orjson.dumps(new.payload)
        fields = [
            F.TYPE, new.type, F.MEMBER, new.member, F.STATUS, TaskStatus.PENDING,
            F.PROGRESS, 0, F.ATTEMPTS, 0, F.CREATED_AT, created, F.UPDATED_AT, created,
            F.EXPIRES_AT, start + c.task_ttl * 1000, F.SEQ, 0,
            F.PAYLOAD_SHA256, digest(body), F.STORED, len(body), *([F.RUN_AT, run_at] if run_at is not None else []),
        ]  # fmt: skip
        for name, value in ((F.MAX_ATTEMPTS, new.max_attempts), (F.PRIORITY, new.priority)):
            if value != UNWRITTEN_DEFAULTS[name]:
                fields += [name, value]
        if new.traceparent:
            fields += [F.TRACEPARENT, new.traceparent]
        if new.callback_url:
            fields += [F.CALLBACK_URL, new.callback_url, F.CALLBACK_EVENTS, ",".join(new.callback_events)]
        if new.batch:
            fields += [F.BATCH, new.batch]
        if new.then_of:
            fields += [F.THEN_OF, new.then_of]
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

    # -- worker side ----------------------------------------------------------------------------
    def start(self, task_id: str, run_id: str, concurrency: str = "") -> Claim:
        """PENDING -> PROCESSING for this run: what it found (see :class:`Claim`). ``concurrency``: the limits
        (app.core.limits.concurrency_spec); a task over its limit is parked instead, its Claim's ``parked``
        saying why."""
        t = now_ms()
        answer = self.run_script(runscripts.START.name, *runscripts.START.call(
            keys={"task": keys.task(task_id), "payload": keys.payload(task_id), "running": keys.RUNNING,
                  "events": keys.events(task_id), "checkpoint": keys.checkpoint(task_id),
                  "cursor": keys.cursor(task_id), "batch_head": keys.BATCH_HEAD, **_LIMIT_KEYS},
            args={"run_id": run_id, "now_ms": t, "task_id": task_id, "concurrency": concurrency,
                  "stall_ms": int(self.config.stall_timeout * 1000)},
        ))
        if answer[0] == 2:
            return Claim(TaskStatus.PENDING, parked=answer[1].decode())
        if answer[0] != 1:
            return Claim(answer[1].decode())
        started = Started(task=Task.from_hash(_pairs(answer[2]), task_id), payload=orjson.loads(answer[1]),
                          checkpoint=answer[3], cursor=answer[4])
        return Claim(TaskStatus.PROCESSING, started)

    def report(
        self, task_id: str, run_id: str, progress: int | None, message: str | None = None,
        items: dict[str, int] | None = None, *, checkpoint: bytes = b"", cursor: bytes | None = None,
        files_run: str | None = None, replace: bool = False,
    ) -> str:
        """Progress (or, with progress None, a bare heartbeat), with the run's checkpoint: a line for the log
        and the cursor's JSON (b"" and None: nothing to save), covering files in the result folder of run
        ``files_run`` (default this run's); ``replace``: the line replaces the log. Returns the status found."""
        t = now_ms()
        total, succeeded, failed = (items["total"], items["succeeded"], items["failed"]) if items else ("", "", "")
        answer = self.run_script(runscripts.PROGRESS.name, *runscripts.PROGRESS.call(
            keys={"task": keys.task(task_id), "running": keys.RUNNING, "events": keys.events(task_id),
                  "checkpoint": keys.checkpoint(task_id), "cursor": keys.cursor(task_id),
                  "batch_head": keys.BATCH_HEAD, "stored_bytes": keys.STORED_BYTES},
            args={"run_id": run_id, "now_ms": t, "progress": "" if progress is None else int(progress),
                  "message": message or "", "items_total": total, "items_succeeded": succeeded, "items_failed": failed,
                  "task_id": task_id, "checkpoint_line": checkpoint, "cursor_json": cursor or "",
                  "files_run": files_run or run_id, "replace": "1" if replace else ""},
            record_ms="" if progress is None else self.config.call_record_ms,  # a bare heartbeat is safe twice
        ))  # fmt: skip
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def _transition(
        self, task_id: str, expected: tuple[str, ...], new_status: str, fields: list[Any], *,
        run_id: str = "", key_ttl: int | str = "", expiry_ms: int | str = "", result: bytes | str = "",
        drop: str = "", stale_before_ms: int | str = "", stat: str | None = None, client: Any = None,
        refund: bool = False, acknowledged: bool = False, waiting_on: str = "", job: Sequence[Command] = (),
        run_at: int | str = "",
    ) -> Transition:
        """The TRANSITION script (see app.core.scripts); ``job``: the commands that queue the task's RQ job,
        replayed in the same step only when the compare-and-set won; ``run_at``: the task, back to PENDING,
        waits in keys.DELAYED until then (a retry's backoff)."""
        job_keys, job_args = lua.replay(job)
        answer = self.run_script(scripts.TRANSITION.name, *scripts.TRANSITION.call(
            keys={"task": keys.task(task_id), "payload": keys.payload(task_id), "result": keys.result(task_id),
                  "running": keys.RUNNING, "expiry": keys.EXPIRY, "events": keys.events(task_id), "stats": keys.STATS,
                  "failures": keys.FAILURES, "active": keys.ACTIVE, "checkpoint": keys.checkpoint(task_id),
                  "cursor": keys.cursor(task_id), "output": keys.output(task_id), "delayed": keys.DELAYED,
                  "settled": keys.SETTLED,
                  "callbacks_due": keys.CALLBACKS_DUE, "batch_head": keys.BATCH_HEAD,
                  "stored_bytes": keys.STORED_BYTES, "waiting_tasks": keys.WAITING, **_LIMIT_KEYS},
            args={"expected": ",".join(expected), "run_id": run_id, "new_status": new_status, "key_ttl_s": key_ttl,
                  "expiry_ms": expiry_ms, "result_json": result, "result_ttl_s": self.config.result_ttl, "drop": drop,
                  "stale_before_ms": stale_before_ms, "now_ms": now_ms(),
                  "stat": STAT_ENTERED.get(new_status, "") if stat is None else stat, "task_id": task_id,
                  "refund": "1" if refund else "", "waiting_on": waiting_on, "job_argc": len(job_args),
                  "run_at_ms": run_at},
            rest_keys=job_keys, rest=[*job_args, *fields], record_ms=self.config.call_record_ms,
        ), client=client, acknowledged=acknowledged)  # fmt: skip
        if client is not None:
            return Transition(True, "")  # queued on a pipeline: the caller reads the answer from execute()
        return Transition(answer[0] == 1, answer[1].decode())

    def _terminal(
        self, task_id: str, expected: tuple[str, ...], status: str, fields: list[Any], *,
        run_id: str = "", result: bytes | str = "", stale_before_ms: int | str = "", waiting_on: str = "",
    ) -> Transition:
        """Any transition into COMPLETED, FAILED or CANCELLED: the result clock starts now. A FAILED or
        CANCELLED task keeps its payload until it expires, so it can run again (app.core.rerun)."""
        c = self.config
        t = now_ms()
        expires = t + c.result_ttl * 1000
        fields = [*fields, F.COMPLETED_AT, t, F.UPDATED_AT, t, F.EXPIRES_AT, expires]
        drop = "checkpoint" if status in RERUNNABLE else "payload"
        return self._transition(
            task_id, expected, status, fields, run_id=run_id, key_ttl=c.result_ttl + c.tombstone_ttl,
            expiry_ms=expires, result=result, drop=drop, stale_before_ms=stale_before_ms, acknowledged=True,
            waiting_on=waiting_on,
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

    def retry(self, task_id: str, run_id: str, message: str, *, run_at: int | None = None,
              job_id: str | None = None) -> bool:
        """PROCESSING -> PENDING: this run gave up. With ``run_at`` (ms) the task waits in keys.DELAYED until
        then, when the scheduler's promote tick queues it as RQ job ``job_id`` (app.core.deferred)."""
        fields: list[Any] = [F.MESSAGE, message, F.UPDATED_AT, now_ms()]
        if run_at is not None:
            fields += [F.RUN_AT, run_at, *([F.JOB, job_id] if job_id else [])]
        return self._transition(task_id, (TaskStatus.PROCESSING,), TaskStatus.PENDING, fields, run_id=run_id,
                                stat=STAT_RETRIED, run_at="" if run_at is None else run_at).done

    def defer(self, task_id: str, run_id: str, message: str, run_at: int, job_id: str, stat: str) -> bool:
        """PROCESSING -> PENDING for this run, which would wait longer than it may for a rate limit's token
        (app.core.limits): the task waits in keys.DELAYED until ``run_at`` (ms), then the promote tick queues it
        as RQ job ``job_id``; its checkpoint stays and the attempt it used is given back (no attempt used)."""
        fields: list[Any] = [F.MESSAGE, message, F.UPDATED_AT, now_ms(), F.RUN_AT, run_at, F.JOB, job_id]
        return self._transition(task_id, (TaskStatus.PROCESSING,), TaskStatus.PENDING, fields, run_id=run_id,
                                stat=stat, refund=True, run_at=run_at).done

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
        jobs = {t: job.decode() if job else t for t, (_, job) in zip(task_ids, found, strict=True)}
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

    def recover(self, task: Task, stale_before_ms: int, job: Sequence[Command] = (),
                job_id: str | None = None) -> str | None:
        """Take a PROCESSING task whose heartbeat stopped: back to PENDING and re-queued (one script with the
        commands ``job`` that queue RQ job ``job_id``, recorded as the task's job), else FAILED -3.

        A lost run is the platform's fault, not the task's: it never uses an attempt (the processor's
        ``retries`` are for its own errors). A run whose checkpoint advanced since the task's last free
        resumption is resumed (the mark moves up to it, the count of lost runs starts again); one that did not
        is run again while fewer than ``Config.lost_runs`` runs were lost in a row without progress. The next
        one ends FAILED -3 with the item it died at: a poison item that kills its worker every time ends after
        ``lost_runs`` + 1 runs. Returns the new status, or None when the task was not stalled after all (a
        heartbeat came in, or it finished)."""
        advanced = task.resumable
        if advanced or task.lost_runs < self.config.lost_runs:
            fields: list[Any] = [F.MESSAGE, "worker lost; resuming from its checkpoint" if advanced
                                 else "worker lost; running again", F.UPDATED_AT, now_ms()]
            if advanced:
                fields += [F.RESUME_MARK, task.checkpoints, *([F.LOST_RUNS, 0] if task.lost_runs else [])]
            else:
                fields += [F.LOST_RUNS, task.lost_runs + 1]
            done = self.requeue(task.id, fields, job, job_id, stale_before_ms=stale_before_ms, stat=STAT_RECOVERED,
                                refund=True)
            return TaskStatus.PENDING if done else None
        lost = ERROR_MESSAGES[ErrorCode.WORKER_LOST] + _where(task)
        failed: list[Any] = [F.ERROR_CODE, ErrorCode.WORKER_LOST, F.ERROR_MESSAGE, lost, F.MESSAGE, lost]
        done = self._terminal(task.id, (TaskStatus.PROCESSING,), TaskStatus.FAILED, failed,
                              stale_before_ms=stale_before_ms).done
        return TaskStatus.FAILED if done else None

    def forget_run(self, task_id: str) -> bool:
        """The task out of the running index unless it is PROCESSING now (FORGET_RUN): True when it left."""
        return bool(self.run_script(runscripts.FORGET_RUN.name, *runscripts.FORGET_RUN.call(
            keys={"task": keys.task(task_id), "running": keys.RUNNING}, args={"task_id": task_id},
            record_ms=self.config.call_record_ms)))

    def interrupted(self, task_id: str, run_id: str, message: str, job: Sequence[Command], job_id: str) -> bool:
        """PROCESSING -> PENDING for this run, which stopped for a worker stop: back on its queue as RQ job
        ``job_id``, the attempt it used given back (an interruption is not a retry)."""
        return self.requeue(task_id, [F.MESSAGE, message, F.UPDATED_AT, now_ms()], job, job_id, run_id=run_id,
                            stat=STAT_INTERRUPTED, refund=True)

    def requeue(self, task_id: str, fields: list[Any], job: Sequence[Command], job_id: str | None, *,
                run_id: str = "", stale_before_ms: int | str = "", stat: str, refund: bool) -> bool:
        """PROCESSING -> PENDING and queued again as RQ job ``job_id`` (the commands ``job``), in one script that
        queues the job only when its compare-and-set won; ``refund`` gives back the attempt the run used: the
        path of :meth:`interrupted` and :meth:`recover`. True when it moved the task."""
        if job_id is not None:
            fields = [*fields, F.JOB, job_id]
        return self._transition(task_id, (TaskStatus.PROCESSING,), TaskStatus.PENDING, fields, run_id=run_id,
                                stale_before_ms=stale_before_ms, stat=stat, refund=refund, job=job).done

    def job_id(self, task_id: str) -> str:
        """The id of the task's current RQ job: the task id, unless a recovery re-queued it under another."""
        job = self.redis.hget(keys.task(task_id), F.JOB)
        return job.decode() if job else task_id


def _where(task: Task) -> str:
    """Where a lost run died, when its items tell (the message of a FAILED -3)."""
    if not task.items:
        return ""
    done = task.items["succeeded"] + task.items["failed"]
    return f" (at item {done + 1} of {task.items['total']}, after the last checkpoint)"


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    """A hash from a script's HGETALL reply (a flat list: field, value, ...)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


_RESULT = F.RESULT.encode()
_LIMIT_KEYS = {"limit_head": keys.LIMIT_HEAD, "limits": keys.LIMITS, "ready": keys.LIMIT_READY}  # limitscripts
