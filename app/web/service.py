"""Submit and cancel: the few steps that span the task store and the RQ queue.

Views call this; it calls the store and the job queue; nothing here knows about HTTP. It raises the typed
errors of :mod:`app.web.errors`, which render them (a refusal gives its retry delay in seconds, not a
header), and says whether a new task's queue is unserved (:meth:`TaskService.unserved`); the view sets
the warning header.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
import redis

from app.core import audit, keys
from app.core.answers import ActiveCapReached, Created, StoredBytesReached, Transition, WithResult
from app.core.clock import now_ms
from app.core.config import Config
from app.core.history import Histories, Page, decode_cursor
from app.core.ids import digest, is_task_id
from app.core.jobs import JobQueue
from app.core.keys import TaskField
from app.core.lines import Place, Places
from app.core.logs import NO_TASK, log_task, task_logger
from app.core.states import ACTIVE, TaskStatus
from app.core.stats import Stats
from app.core.store import TaskStore
from app.core.submit import create_task
from app.core.task import Task
from app.web.errors import Conflict, TooManyRequests, ValidationFailed, task_not_found
from app.web.readiness import STAT_UNSERVED, WorkerWatch

log = logging.getLogger(__name__)
_STATUS, _LINE, _PENDING = TaskField.STATUS.encode(), TaskField.LINE.encode(), TaskStatus.PENDING.encode()
OUT_OF_LINE_KEPT = 32_768  # task ids a web process remembers as out of their line (~4 MB at most; read_placed)
ACTIVE_CAP_RETRY_AFTER = 5  # seconds: a 429 for the active-task cap cannot know when a task ends


def over_active_cap(exc: ActiveCapReached) -> TooManyRequests:
    """The 429 for a write that would give the member one unfinished task more than its cap (a submit, a
    run again)."""
    return TooManyRequests(
        f"you have {exc.active} unfinished tasks, the most one member may have (TASKPORT_MAX_ACTIVE_TASKS): "
        "wait for some to finish or cancel some",
        retry_after=ACTIVE_CAP_RETRY_AFTER, limit="max_active_tasks", cap=exc.cap, active=exc.active,
    )
STORED_BYTES_RETRY_AFTER = 60  # seconds: a 429 for the stored-bytes quota lasts until tasks end and expire


def over_stored_bytes(exc: StoredBytesReached) -> TooManyRequests:
    """The 429 for a submit (or batch) whose payloads would take the member past its quota of bytes in Redis."""
    return TooManyRequests(
        f"your tasks hold {exc.held} bytes in Redis, and this submit would pass the {exc.cap} bytes one member may "
        "hold (TASKPORT_MAX_STORED_BYTES): wait for results to expire, or cancel tasks",
        retry_after=STORED_BYTES_RETRY_AFTER, limit="max_stored_bytes", cap=exc.cap, held=exc.held,
    )


UNKNOWN_TASK = "No such task."  # an ``after`` id that is unknown, malformed or someone else's: the same words


def dedup_digest(task_type: str, payload: dict[str, Any], explicit: str | None) -> str:
    """SHA-256 of the explicit key, or of the type and the canonical JSON of the payload."""
    if explicit is not None:
        material = b"key\n" + explicit.encode()
    else:
        material = b"payload\n" + task_type.encode() + b"\n" + orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return digest(material)


class BadCursor(ValueError):
    """A history cursor this service did not make."""


class TaskService:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.config = config
        self.redis = conn
        self.store = TaskStore(conn, config)
        self.histories = Histories(self.store)
        self.stats = Stats(conn)
        self.jobs = JobQueue(conn, config)
        self.workers = WorkerWatch(conn)  # live worker counts, cached briefly (the no-worker warning)
        self.places = Places(conn)  # a status read with the task's place in line
        self._out_of_line: dict[str, None] = {}  # ids seen out of their line, oldest first (read_placed)

    def submit(self, member: str, task_type: str, payload: dict[str, Any], dedup_key: str | None,
               priority: str | None, submitted: dict[str, Any] | None = None, *, run_at: int | None = None,
               after: Sequence[str] | None = None, callback: dict[str, Any] | None = None) -> Created:
        """Create and queue a task, or name (and read) the task holding the dedup key: one round trip either way.

        ``payload`` is the validated payload the processor gets; the dedup hash covers ``submitted``,
        the payload as the client sent it (the contract's "canonical JSON of the payload"). ``run_at`` (ms)
        and ``after`` (task ids: ValidationFailed naming ``after.N`` for one not the member's) make it wait.
        """
        dedup = dedup_digest(task_type, payload if submitted is None else submitted, dedup_key)
        try:
            outcome = create_task(self.store, self.jobs, member, task_type, payload, dedup, priority, run_at=run_at,
                                  after=self.owned_ids(member, after) if after is not None else (), callback=callback)
        except ActiveCapReached as exc:
            log.info("submit of %s by %s refused: %s", task_type, member, exc)
            raise over_active_cap(exc) from None
        except StoredBytesReached as exc:
            log.info("submit of %s by %s refused: %s", task_type, member, exc)
            raise over_stored_bytes(exc) from None
        # At INFO: a task's log lines tell its story from the submit on (docs/operations.md, "Logs"), though the
        # line costs ~4 µs of a submit's web CPU, written without a record (bench/README.md, "Submit, eighth pass").
        if outcome.created:
            assert outcome.task is not None
            log_task(log, logging.INFO, outcome.task_id, "submitted %s by %s on queue %s", task_type, member,
                     outcome.task.priority)
        else:
            log_task(log, logging.INFO, outcome.task_id, "duplicate submit of %s by %s", task_type, member)
        return outcome

    def owned_ids(self, member: str, task_ids: Sequence[str]) -> list[str]:
        """``task_ids`` once each, in order, when every one is the member's task; else ValidationFailed naming
        ``after.N`` of each that is not, with the same words for unknown, malformed and someone else's."""
        unique = list(dict.fromkeys(task_ids))
        valid = [t for t in unique if is_task_id(t)]
        tasks = dict(zip(valid, self.store.get_many(valid), strict=True)) if valid else {}
        wrong = {f"after.{i}": [UNKNOWN_TASK] for i, t in enumerate(task_ids)
                 if (task := tasks.get(t)) is None or task.member != member}
        if wrong:
            raise ValidationFailed(wrong)
        return unique

    def unserved(self, queue: str, task_id: str = NO_TASK, batch_id: str | None = None) -> bool:
        """Whether no worker listens on ``queue``, asked for a task (or a batch's tasks) just accepted on it (it
        stays PENDING until one starts): when so it is counted (``STAT_UNSERVED``) and logged, under the task's
        id or naming the batch. False when Redis cannot say: the task was accepted, the warning is a courtesy."""
        try:
            if queue not in self.workers.unserved():
                return False
            self.stats.count(STAT_UNSERVED)
        except redis.RedisError:
            return False
        what = f"batch {batch_id}" if batch_id else "task"
        task_logger(log, task_id).warning("%s submitted while no worker listens on queue %s", what, queue)
        return True

    def find(self, member: str, task_id: str) -> Task:
        """The member's task, or NotFound (unknown, someone else's and malformed ids look the same)."""
        return _owned(member, self.store.get(task_id) if is_task_id(task_id) else None)

    def find_placed(self, member: str, task_id: str) -> tuple[Task, Place | None]:
        """The member's task and, while it waits in a line, its place (app.core.lines), or NotFound."""
        if not is_task_id(task_id):
            raise task_not_found()
        h, place = self.read_placed(task_id)
        return _owned(member, Task.from_hash(h, task_id) if h else None), place

    def read_placed(self, task_id: str) -> tuple[dict[bytes, bytes], Place | None]:
        """The task's hash (empty when gone) and, while it waits in a line, its place: one round trip, most times.

        The place script (:class:`app.core.lines.Places`, which answers the hash too) costs ~20 µs of Redis CPU
        against ~2 µs for an HGETALL (EVALSHA, the hash converted to Lua and back): a waste on a task that runs
        or ended, which no longer needs a place. So a task this process has seen out of its line (a hint, kept
        for the last :data:`OUT_OF_LINE_KEPT` ids) is read plainly, and through the script again only if that
        read shows it back in a line (a retry, a run again); any other task is read through the script, as a
        task that waits must be (docs/design.md, "The status read")."""
        if task_id in self._out_of_line:
            plain: dict[bytes, bytes] = self.redis.hgetall(keys.task(task_id))  # type: ignore[assignment]
            if plain.get(_STATUS) != _PENDING or _LINE not in plain:
                return plain, None
            self._out_of_line.pop(task_id, None)
        h, place = self.places.read(task_id)
        if place is None and h and (h.get(_STATUS) != _PENDING or _LINE not in h):
            self.out_of_line(task_id)
        return h, place

    def out_of_line(self, task_id: str) -> None:
        """Note that ``task_id`` has left its line (see :meth:`read_placed`); the oldest note goes past the cap."""
        self._out_of_line[task_id] = None
        if len(self._out_of_line) > OUT_OF_LINE_KEPT:
            try:
                del self._out_of_line[next(iter(self._out_of_line))]
            except (KeyError, RuntimeError, StopIteration):  # changed meanwhile (a gthread worker's other thread)
                pass

    def find_with_result(self, member: str, task_id: str) -> tuple[Task, dict[str, Any] | None]:
        """The member's task and its stored result (one round trip), or NotFound."""
        found = self.store.get_with_result(task_id) if is_task_id(task_id) else WithResult(None, None)
        return _owned(member, found.task), found.result

    def snapshot_placed(self, task_id: str) -> tuple[Task | None, Place | None]:
        """The task as it is now, whoever owns it, and its place in line (an event stream's first read)."""
        h, place = self.read_placed(task_id)
        return (Task.from_hash(h, task_id) if h else None), place

    def snapshot(self, task_id: str) -> Task | None:
        """The task as it is now, whoever owns it (an event stream's first read, once its watch is set)."""
        return self.store.get(task_id)

    def history(self, member: str, *, limit: int, cursor: str | None, status: str | None, type_: str | None,
                now: int) -> Page:
        """A page of the member's tasks (see :meth:`app.core.history.Histories.page`); BadCursor, before any
        read, for a cursor this service did not make."""
        if cursor:
            check_cursor(cursor)
        return self.histories.page(member, limit=limit, cursor=cursor, status=status, type_=type_, now=now)

    def audit_trail(self, *, task_id: str | None, member: str | None, limit: int,
                    cursor: str | None) -> audit.AuditPage:
        """A page of the audit trail (operators), newest first, of one task or member or all."""
        return audit.read(self.redis, task_id=task_id, member=member, limit=limit, cursor=cursor)

    def cancel(self, member: str, task_id: str) -> None:
        task, now = self.find(member, task_id), now_ms()
        status = task.effective_status(now)
        done, previous = Transition(False, status) if status not in ACTIVE else self.store.cancel(task_id)
        if not done:
            raise Conflict(f"task is {previous}; only PENDING or PROCESSING tasks can be cancelled",
                           task_status=previous)
        job = self.store.job_id(task_id)
        in_flight = ""
        if previous != TaskStatus.PENDING:
            self.jobs.stop(job)
        elif self.jobs.remove(job) and not task.waits(now):  # a waiting task has no job to find
            in_flight = "; a worker had just taken its job and will drop it"
        task_logger(log, task_id).info("cancelled (was %s%s)", previous, in_flight)


def check_cursor(cursor: str) -> None:
    """BadCursor unless ``cursor`` is one a history page handed out."""
    try:
        decode_cursor(cursor)
    except ValueError:
        raise BadCursor(cursor) from None


def _owned(member: str, task: Task | None) -> Task:
    if task is None or task.member != member:
        raise task_not_found()
    return task
