"""Task statuses, the transition table and the service's own error codes: their only home."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    DUPLICATE = "DUPLICATE"  # only ever an answer to a duplicate submit, never stored


class BatchStatus(StrEnum):
    """A batch's status (app.core.batches): it has unfinished tasks, or none."""

    RUNNING = "RUNNING"
    DONE = "DONE"


class CallbackState(StrEnum):
    """A task's or batch's callback state (TaskField / BatchField CALLBACK_STATE): its latest delivery's."""

    PENDING = "pending"  # from the event until the delivery ends (and before the first event)
    DELIVERED = "delivered"
    FAILED = "failed"


# Not a status: what the progress script answers a run whose claim another run holds now (recovery
# re-queued its task). The run stops at its next cancellation point and touches nothing of the new run.
CLAIM_TAKEN = "TAKEN"
# Not a status either: what the start script answers when the task's payload key is gone (the task
# hash outlived it), so the run cannot start the task.
MISSING_PAYLOAD = "MISSING_PAYLOAD"

ACTIVE = frozenset({TaskStatus.PENDING, TaskStatus.PROCESSING})
TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
STORED = ACTIVE | TERMINAL | {TaskStatus.EXPIRED}

# Every transition the code performs, (from, to). The Lua scripts enforce "from" at write time;
# tests assert that every transition the store asks for is listed here.
TRANSITIONS: frozenset[tuple[TaskStatus, TaskStatus]] = frozenset(
    {
        (TaskStatus.PENDING, TaskStatus.PROCESSING),
        (TaskStatus.PENDING, TaskStatus.CANCELLED),
        (TaskStatus.PENDING, TaskStatus.EXPIRED),
        (TaskStatus.PENDING, TaskStatus.FAILED),  # a task it runs after (``after``) did not complete: -6
        (TaskStatus.PROCESSING, TaskStatus.PENDING),  # retry, recovery after a lost worker, or a graceful stop
        (TaskStatus.PROCESSING, TaskStatus.COMPLETED),
        (TaskStatus.PROCESSING, TaskStatus.FAILED),
        (TaskStatus.PROCESSING, TaskStatus.CANCELLED),
        (TaskStatus.PROCESSING, TaskStatus.EXPIRED),
        (TaskStatus.COMPLETED, TaskStatus.EXPIRED),
        (TaskStatus.FAILED, TaskStatus.EXPIRED),
        (TaskStatus.CANCELLED, TaskStatus.EXPIRED),
        (TaskStatus.FAILED, TaskStatus.PENDING),  # run again (POST /tasks/{id}/retry): the same task, a new run
        (TaskStatus.CANCELLED, TaskStatus.PENDING),
    }
)
# The statuses a task may be run again from (app.core.rerun): it ended without a result.
RERUNNABLE = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED})


# Error codes are plain ``int`` constants in a namespace class, not IntEnum members: a code is a
# Redis command argument (HSET, Lua ARGV) and hiredis, redis-py's command packer, refuses int subclasses.


class ErrorCode:
    """The service's own (negative) task error codes; business codes are positive."""

    INTERNAL = -1
    TIMEOUT = -2
    WORKER_LOST = -3
    EXPIRED = -4
    RESULT_STORE = -5
    DEPENDENCY = -6


class BusinessCode:
    """Business error codes of the built-in processors (positive; a user's processors choose their own)."""

    BILL_UNPAID = 10001
    INVALID_QUANTITY = 10002
    NOT_A_THEN = 10003  # batch.summary outside a batch's then task


ERROR_MESSAGES = {
    ErrorCode.INTERNAL: "processing error, please retry later",
    ErrorCode.TIMEOUT: "task timed out",
    ErrorCode.WORKER_LOST: "worker lost: the process running the task died and no retry was left",
    ErrorCode.EXPIRED: "task expired before it finished",
    ErrorCode.RESULT_STORE: "result store unavailable: the result could not be stored, please retry later",
    ErrorCode.DEPENDENCY: "a task it depends on did not complete",  # + ": <its id> is <its status>" (TaskStore)
}

# RQ queue names: a task's ``priority``. Plain strings (they are Redis keys' parts and command arguments).
HIGH_QUEUE = "high"  # only for API keys granted it (TASKPORT_API_KEYS key:member:high), and open mode
DEFAULT_QUEUE = "default"  # a processor's when its registration names none
LOW_QUEUE = "low"
QUEUES = (HIGH_QUEUE, DEFAULT_QUEUE, LOW_QUEUE)  # in the order workers listen
# The queue of callback deliveries (workers.delivery): served by the deliverer process only, never by a task
# worker, so a receiver that answers slowly never holds up a task, nor a task queue backlog a callback.
CALLBACK_QUEUE = "callbacks"
