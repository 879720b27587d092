"""Submit and cancel: the few steps that span the task store and the RQ queue.

Views call this; it calls the store and the job queue; nothing here knows about HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from app import processors
from app.config import Config
from app.errors import Conflict, TooManyRequests, task_not_found
from app.ids import is_task_id
from app.jobs import JobQueue
from app.logs import task_logger
from app.states import ACTIVE, TaskStatus
from app.store import ActiveCapReached, NewTask, TaskStore
from app.task import Task, now_ms

log = logging.getLogger(__name__)
ACTIVE_CAP_RETRY_AFTER = 5  # seconds: a 429 for the active-task cap cannot know when a task ends


def dedup_digest(task_type: str, payload: dict[str, Any], explicit: str | None) -> str:
    """SHA-256 of the explicit key, or of the type and the canonical JSON of the payload."""
    if explicit is not None:
        material = b"key\n" + explicit.encode()
    else:
        material = b"payload\n" + task_type.encode() + b"\n" + orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    # base64url of the whole digest: 43 characters instead of 64 hex, in a key held for every submit
    return base64.urlsafe_b64encode(hashlib.sha256(material).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class Submitted:
    created: bool
    task: Task | None  # the new task, or the one holding the dedup key (None if it vanished meanwhile)
    task_id: str


class TaskService:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.config = config
        self.store = TaskStore(conn, config)
        self.jobs = JobQueue(conn, config)

    def submit(self, member: str, task_type: str, payload: dict[str, Any], dedup_key: str | None,
               priority: str | None, submitted: dict[str, Any] | None = None) -> Submitted:
        """Create and queue a task, or name the task holding the dedup key.

        ``payload`` is the validated payload the processor gets; the dedup hash covers ``submitted``,
        the payload as the client sent it (the contract's "canonical JSON of the payload").
        """
        proc = processors.get(task_type)
        assert proc is not None, "validated before"
        digest = dedup_digest(task_type, payload if submitted is None else submitted, dedup_key)
        new = NewTask(
            task_id=str(uuid.uuid4()), member=member, type=task_type, payload=payload, dedup_digest=digest,
            priority=priority or proc.priority, max_attempts=proc.retries + 1,
        )
        try:
            created, holder, task = self.store.create(
                new, lambda pipe: self.jobs.enqueue(new.task_id, new.priority, proc.timeout, pipeline=pipe))
        except ActiveCapReached as exc:
            log.info("submit of %s by %s refused: %s", task_type, member, exc)
            raise TooManyRequests(
                f"you have {exc.active} unfinished tasks, the most one member may have "
                "(TASKPORT_MAX_ACTIVE_TASKS): wait for some to finish or cancel some",
                headers={"Retry-After": str(ACTIVE_CAP_RETRY_AFTER)}, limit="max_active_tasks", cap=exc.cap,
                active=exc.active) from None
        tlog = task_logger(log, holder)
        if not created:
            tlog.info("duplicate submit of %s by %s", task_type, member)
            return Submitted(False, self.store.get(holder), holder)
        tlog.info("submitted %s by %s on queue %s", task_type, member, new.priority)
        return Submitted(True, task, new.task_id)

    def find(self, member: str, task_id: str) -> Task:
        """The member's task, or NotFound (unknown, someone else's and malformed ids look the same)."""
        return _owned(member, self.store.get(task_id) if is_task_id(task_id) else None)

    def find_with_result(self, member: str, task_id: str) -> tuple[Task, dict[str, Any] | None]:
        """The member's task and its stored result (one round trip), or NotFound."""
        task, stored = self.store.get_with_result(task_id) if is_task_id(task_id) else (None, None)
        return _owned(member, task), stored

    def cancel(self, member: str, task_id: str) -> None:
        status = self.find(member, task_id).effective_status(now_ms())
        done, previous = (False, status) if status not in ACTIVE else self.store.cancel(task_id)
        if not done:
            raise Conflict(f"task is {previous}; only PENDING or PROCESSING tasks can be cancelled",
                           task_status=previous)
        job = self.store.job_id(task_id)
        if previous == TaskStatus.PENDING:
            self.jobs.remove(job)
        else:
            self.jobs.stop(job)
        task_logger(log, task_id).info("cancelled (was %s)", previous)


def _owned(member: str, task: Task | None) -> Task:
    if task is None or task.member != member:
        raise task_not_found()
    return task
