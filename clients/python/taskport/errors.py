"""The client's exceptions: one base, :class:`TaskportError`, and two families under it.

- :class:`ProblemError` and its subclasses: the service answered with RFC 9457 problem details (or an
  error status). They carry ``status``, ``type``, ``title``, ``detail`` and the field ``errors``.
- :class:`TaskEnded` and its subclasses, plus :class:`StillRunning`: the task itself did not give a
  result (FAILED with ``code``, CANCELLED, EXPIRED), or was still running when the caller's limit ran
  out. ``code`` is the task's ``error.code``: a business code (positive, e.g. 10001) or one of the
  service's own, negative: :class:`ErrorCode` (re-exported here from :mod:`taskport.states`, the client's copy
  of the service's table), e.g. ``exc.code == ErrorCode.TIMEOUT``.

:class:`ServiceUnreachable` means no HTTP answer at all (connection refused, DNS, timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from taskport.states import ErrorCode as ErrorCode  # re-exported: the codes a client compares ``code`` with
from taskport.states import TaskStatus

if TYPE_CHECKING:
    import httpx

Doc = dict[str, Any]


class TaskportError(Exception):
    """Base of every exception the client raises."""


class ServiceUnreachable(TaskportError):
    """No HTTP answer from the service (connection refused, name not resolved, timed out)."""


class StreamFailed(TaskportError):
    """The event stream could not be (re)opened; :meth:`Client.follow` then polls instead."""


class ProblemError(TaskportError):
    """An error answer from the service, with its problem details."""

    def __init__(self, status: int, body: Doc | None, retry_after: float | None = None) -> None:
        self.status = status
        self.body: Doc = body or {}
        self.type: str = str(self.body.get("type", "about:blank"))
        self.title: str = str(self.body.get("title", f"HTTP {status}"))
        self.detail: str = str(self.body.get("detail", ""))
        self.errors: dict[str, list[str]] = dict(self.body.get("errors") or {})
        self.retry_after = retry_after
        super().__init__(self.describe())

    def describe(self) -> str:
        """One line: ``422 Unprocessable: detail (field: message; ...)``."""
        text = f"{self.status} {self.title}" + (f": {self.detail}" if self.detail else "")
        if self.errors:
            fields = "; ".join(f"{name}: {' '.join(map(str, messages))}" for name, messages in self.errors.items())
            text += f" ({fields})"
        return text


class InvalidRequest(ProblemError):
    """400, 413, 415 or 422: the request itself is wrong (see ``errors`` for the fields)."""


class Unauthorized(ProblemError):
    """401: the API key is missing or unknown."""


class NotFound(ProblemError):
    """404: no such task (or batch, or schedule) for this member (unknown, someone else's, or gone entirely)."""


class Conflict(ProblemError):
    """409: the task is in a state that does not allow the request (``task_status``, ``error``)."""

    @property
    def task_status(self) -> str | None:
        value = self.body.get("task_status")
        return None if value is None else str(value)


class DuplicateTask(Conflict):
    """409 on submit: the same dedup key within the window. ``existing`` is that task's status document."""

    @property
    def existing(self) -> Doc:
        return dict(self.body.get("existing") or {})

    @property
    def task_id(self) -> str:
        return str(self.body.get("task_id", ""))


class Gone(ProblemError):
    """410 where a document was expected but the task expired (the body is its EXPIRED status document)."""


class TooManyRequests(ProblemError):
    """429: over a limit of the member's (the request rate, the active tasks, which a batch counts task by task,
    the open streams, the schedules); ``retry_after`` says when to try again."""


class Unavailable(ProblemError):
    """503: the service cannot reach its Redis; ``retry_after`` says when to try again."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: InvalidRequest, 413: InvalidRequest, 415: InvalidRequest, 422: InvalidRequest,
    401: Unauthorized, 404: NotFound, 409: Conflict, 410: Gone, 429: TooManyRequests, 503: Unavailable,
}


def problem_class(status: int) -> type[ProblemError]:
    return _BY_STATUS.get(status, ProblemError)


class TaskEnded(TaskportError):
    """The task ended without a result. ``doc`` is its last status document (when one was read)."""

    status = ""

    def __init__(self, task_id: str, doc: Doc | None = None, code: int | None = None, message: str = "") -> None:
        self.task_id = task_id
        self.doc = doc
        error = (doc or {}).get("error") or {}
        self.code: int | None = code if code is not None else error.get("code")
        self.message: str = message or str(error.get("message", ""))
        text = f"task {task_id} {self.status}"
        if self.code is not None:
            text += f" with code {self.code}" + (f": {self.message}" if self.message else "")
        super().__init__(text)


class TaskFailed(TaskEnded):
    """The whole task FAILED; ``code`` is its ``error.code`` (business code or the service's own)."""

    status = TaskStatus.FAILED.value


class TaskCancelled(TaskEnded):
    """The task was CANCELLED."""

    status = TaskStatus.CANCELLED.value


class TaskExpired(TaskEnded):
    """The task is EXPIRED (it did not finish in time (-4), or its result was dropped after its time)."""

    status = TaskStatus.EXPIRED.value


class StillRunning(TaskportError):
    """The caller's limit (``timeout`` or ``max_attempts``) ran out while the task (or the batch: ``kind``) was
    still running.

    Not a failure of the task: check its status (or the history) later. ``doc`` is the last status read.
    """

    def __init__(self, task_id: str, doc: Doc | None, attempts: int, kind: str = "task") -> None:
        self.task_id = task_id
        self.doc = doc
        self.attempts = attempts
        self.kind = kind
        status = (doc or {}).get("status", TaskStatus.PENDING.value)
        progress = (doc or {}).get("progress", 0)
        plural = "" if attempts == 1 else "s"
        later = "check its status or the history later" if kind == "task" else "check its status later"
        super().__init__(f"{kind} {task_id} is still {status} ({progress}%) after {attempts} attempt{plural}: {later}")


ENDED: dict[str, type[TaskEnded]] = {cls.status: cls for cls in (TaskFailed, TaskCancelled, TaskExpired)}


def json_document(response: httpx.Response, expected: int, refuse: Callable[[httpx.Response], NoReturn]) -> Doc:
    """The JSON object of a ``expected`` answer (a schedule's or a batch's document); any other answer goes to
    ``refuse`` (the client's typed problem), and a body that is no JSON object is a ProblemError."""
    if response.status_code != expected:
        refuse(response)
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ProblemError(response.status_code, None)
    return body
