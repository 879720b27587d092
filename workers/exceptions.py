"""Exceptions a processor raises (or meets) while it runs (the codes live in app.core.states).

``TaskError`` and ``ItemError`` carry a business code (a positive integer, e.g. 10001) that ends up
in the task's ``error`` or in a failure record; ``TaskCancelled`` is raised *by the context* at a
checkpoint once the task is no longer this worker's to run. They keep their arguments in ``args``
so they survive pickling (RQ stores exceptions of failed jobs).
"""

from __future__ import annotations


class _CodedError(Exception):
    """An error with a business code and a message meant for the API's client."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(int(code), message)
        self.code = int(code)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class TaskError(_CodedError):
    """Raised by a processor to fail the whole task with a business code (never retried)."""


class ItemError(_CodedError):
    """Raised inside one item's work to fail that item only; the task goes on with the next item."""


class TaskCancelled(Exception):
    """The task is no longer ours to run (cancelled, expired or taken over): stop now, write nothing."""


class TaskInterrupted(TaskCancelled):
    """The worker is stopping (SIGTERM: a deploy, a restart): stop now; the runner saves the checkpoint and
    puts the task back on its queue without using an attempt, and the next run resumes where this one
    stopped. A subclass of TaskCancelled, so code that stops on a cancel stops on this too."""


class RateDeferred(TaskInterrupted):
    """``ctx.limit`` would wait longer for its token than a worker may be held (``TASKPORT_RATE_WAIT_MAX``): the
    runner saves the checkpoint and puts the task back with a ``run_at`` ``wait`` seconds ahead, no attempt used.
    A subclass of TaskInterrupted, so code that stops on a stop stops on this too."""

    def __init__(self, task_id: str, name: str, wait: float) -> None:
        super().__init__(task_id, name, wait)
        self.name = name
        self.wait = wait
