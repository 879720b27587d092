"""The names of the service's contract a client spells: task and batch statuses, the service's own error
codes and the queue names (a task's ``priority``).

Their home is the service's ``app.core.states``; this is the client's copy, since the client distribution
(taskport-client) installs without the service. tests/unit/test_client_states.py fails when the two differ,
so a status or code added on the service's side must be added here too.
"""

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
    """A batch's status: it has unfinished tasks, or none."""

    RUNNING = "RUNNING"
    DONE = "DONE"


ACTIVE = frozenset({TaskStatus.PENDING, TaskStatus.PROCESSING})
TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
STORED = ACTIVE | TERMINAL | {TaskStatus.EXPIRED}


class ErrorCode:
    """The service's own (negative) task error codes; business codes are positive."""

    INTERNAL = -1
    TIMEOUT = -2
    WORKER_LOST = -3
    EXPIRED = -4
    RESULT_STORE = -5
    DEPENDENCY = -6


QUEUES = ("high", "default", "low")  # a task's priority, in the order workers listen
