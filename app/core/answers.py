"""What the task store (app.core.store) takes and answers: small named results, and its two refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from app.core.task import Task


class ActiveCapReached(Exception):
    """A submit refused: the member already holds ``cap`` unfinished tasks (``Config.active_task_cap``)."""

    def __init__(self, cap: int, active: int) -> None:
        super().__init__(f"{active} unfinished tasks, the cap is {cap}")
        self.cap, self.active = cap, active


class StoredBytesReached(Exception):
    """A submit whose payloads would take the member past its quota of bytes held in Redis (nothing written)."""

    def __init__(self, cap: int, held: int) -> None:
        super().__init__(f"member holds {held} bytes in Redis, its quota is {cap} (TASKPORT_MAX_STORED_BYTES)")
        self.cap = cap
        self.held = held


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
    callback_url: str = ""  # where its terminal events are delivered ('' = nowhere)
    callback_events: tuple[str, ...] = ()  # which ones
    batch: str = ""  # the batch it is created in ('' = none)
    then_of: str = ""  # the batch whose then task it is ('' = none)
    traceparent: str = ""  # the submit's span, when tracing is on (app.core.tracing): its runs are in that trace


class Created(NamedTuple):
    """What a submit did: ``created``, or not (a duplicate) and ``task_id`` names the task holding the
    dedup key. ``task`` is the new task as written, or the holder as read (None if it vanished meanwhile)."""

    created: bool
    task_id: str
    task: Task | None


@dataclass(frozen=True)
class Started:
    """What a worker needs once it owns a task: the task, its payload, and the checkpoint log and cursor
    earlier runs saved (None when there are none; see workers.checkpoint)."""

    task: Task
    payload: dict[str, Any]
    checkpoint: bytes | None = None
    cursor: bytes | None = None


@dataclass(frozen=True)
class Claim:
    """What :meth:`TaskStore.start` found: ``started`` when this run took the task; else None, and
    ``status`` is the status that prevented it ('' when the task is gone); ``parked``: why it waits instead, in
    its concurrency limit's line (app.core.limits), still PENDING."""

    status: str
    started: Started | None = None
    parked: str = ""


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
