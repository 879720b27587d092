"""RunStore: a run's writes to its task, the worker's side of :class:`app.core.store.TaskStore` (its base).

A run takes its task (:meth:`RunStore.start`, the START script of app.core.runscripts), reports its progress,
heartbeat and checkpoint (:meth:`RunStore.report`, PROGRESS) and ends it: completed, failed, retried, deferred
for a rate limit or interrupted by a worker stop (TRANSITION, through :class:`app.core.scriptstore.ScriptStore`).
Recovery's moves on a run that stopped beating are here too (:meth:`RunStore.recover`, :meth:`RunStore.forget_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from app.core import keys, runscripts
from app.core.answers import Claim, ResultNotStorable, Started
from app.core.clock import now_ms
from app.core.keys import STAT_INTERRUPTED, STAT_RECOVERED, STAT_RETRIED
from app.core.keys import TaskField as F
from app.core.lua import Command
from app.core.scriptstore import LIMIT_KEYS, ScriptStore, pairs
from app.core.states import ERROR_MESSAGES, ErrorCode, TaskStatus
from app.core.task import Task

# A result whose JSON is at most this long lives in the task's hash instead of a key of its own: Redis
# keeps a hash compact (ziplist/listpack) while every value is within hash-max-ziplist-value (64 by
# default), and a key of its own costs more than a hundred bytes of bookkeeping.
INLINE_RESULT_MAX = 64


def _items_fields(items: dict[str, int] | None) -> list[Any]:
    if items is None:
        return []
    return [F.ITEMS_TOTAL, items["total"], F.ITEMS_SUCCEEDED, items["succeeded"], F.ITEMS_FAILED, items["failed"]]


class RunStore(ScriptStore):
    def start(self, task_id: str, run_id: str, concurrency: str = "", worker: str = "") -> Claim:
        """PENDING -> PROCESSING for this run: what it found (see :class:`Claim`). ``concurrency``: the limits
        (app.core.limits.concurrency_spec); a task over its limit is parked instead, its Claim's ``parked``
        saying why. ``worker``: the simple worker's RQ name, kept in the task while the run holds it (F.WORKER)."""
        return self.claim_of(task_id, self.run_script(runscripts.START.name, *self._start_call(task_id, run_id,
                                                                                             concurrency, worker)))

    def start_on(self, pipe: Any, task_id: str, run_id: str, concurrency: str = "", worker: str = "") -> None:
        """Queue :meth:`start`'s script on ``pipe`` (a pipeline without MULTI) as EVALSHA: the simple worker sends it
        in the round trip that records the job's start in RQ (workers.worker). Its reply goes to :meth:`claim_of`;
        after an error reply (NOSCRIPT: a Redis whose script cache was emptied) the run calls :meth:`start`."""
        keys_, args = self._start_call(task_id, run_id, concurrency, worker)
        keys_ = [*keys_, keys.AUDIT]  # as run_script: every script's last key
        pipe.evalsha(self._scripts[runscripts.START.name].sha, len(keys_), *keys_, *args)

    def _start_call(self, task_id: str, run_id: str, concurrency: str, worker: str) -> tuple[list[str], list[Any]]:
        return runscripts.START.call(
            keys={"task": keys.task(task_id), "payload": keys.payload(task_id), "running": keys.RUNNING,
                  "events": keys.events(task_id), "checkpoint": keys.checkpoint(task_id),
                  "cursor": keys.cursor(task_id), "batch_head": keys.BATCH_HEAD, **LIMIT_KEYS},
            args={"run_id": run_id, "now_ms": now_ms(), "task_id": task_id, "concurrency": concurrency,
                  "stall_ms": int(self.config.stall_timeout * 1000), "worker": worker})

    @staticmethod
    def claim_of(task_id: str, answer: Any) -> Claim:
        """START's answer as a :class:`Claim`."""
        if answer[0] == 2:
            return Claim(TaskStatus.PENDING, parked=answer[1].decode())
        if answer[0] != 1:
            return Claim(answer[1].decode())
        started = Started(task=Task.from_hash(pairs(answer[2]), task_id), payload=orjson.loads(answer[1]),
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

    def complete(
        self, task_id: str, run_id: str, result: Any, *, items: dict[str, int] | None,
        failures: list[dict[str, Any]], error_code: int | None, message: str | None = None,
        files_run: str | None = None, job: Sequence[Command] = (),
    ) -> bool:
        """PROCESSING -> COMPLETED for this run, with its result. ``files_run`` names the run whose result
        folder holds the result's files (see app.core.results). ``job``: commands written in the same step, only
        when it wins (the simple worker's record of the job's end in RQ: workers.worker). Raises
        ResultNotStorable, writing nothing, when the result is not JSON-serializable or longer than
        ``Config.max_result``."""
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
                              result=body, job=job).done

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


def _where(task: Task) -> str:
    """Where a lost run died, when its items tell (the message of a FAILED -3)."""
    if not task.items:
        return ""
    done = task.items["succeeded"] + task.items["failed"]
    return f" (at item {done + 1} of {task.items['total']}, after the last checkpoint)"
