"""taskport's client side: a Python client (:mod:`taskport.client`) and the client commands of the
``taskport`` CLI (:mod:`taskport.cli`).

This package imports neither Flask nor Redis nor anything under ``app``/``workers``: a script that only
talks to a taskport service over HTTP needs httpx, httpx-sse (and rich for the CLI), nothing else.
"""

from taskport.client import Client, Event
from taskport.errors import (
    Conflict,
    DuplicateTask,
    Gone,
    InvalidRequest,
    NotFound,
    ProblemError,
    ServiceUnreachable,
    StillRunning,
    StreamFailed,
    TaskCancelled,
    TaskEnded,
    TaskExpired,
    TaskFailed,
    TaskportError,
    Unauthorized,
    Unavailable,
)
from taskport.settings import ClientSettings

__all__ = [
    "Client", "ClientSettings", "Conflict", "DuplicateTask", "Event", "Gone", "InvalidRequest", "NotFound",
    "ProblemError", "ServiceUnreachable", "StillRunning", "StreamFailed", "TaskCancelled", "TaskEnded",
    "TaskExpired", "TaskFailed", "TaskportError", "Unauthorized", "Unavailable",
]
