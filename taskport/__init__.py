"""taskport's client side: a Python client (:mod:`taskport.client`) and the client commands of the
``taskport`` CLI (:mod:`taskport.cli`).

This package imports neither Flask nor Redis nor anything of ``app``/``workers`` but ``app.core.states``,
the service's table of status names and error codes (which imports nothing of ours), so the client
spells them as the service does: a script that only talks to a taskport service over HTTP needs httpx,
httpx-sse (and rich for the CLI), nothing else (tests/unit/test_imports.py holds this).
"""

from taskport.client import Client, Event
from taskport.errors import (
    Conflict,
    DuplicateTask,
    ErrorCode,
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
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from taskport.settings import ClientSettings

__all__ = [
    "Client", "ClientSettings", "Conflict", "DuplicateTask", "ErrorCode", "Event", "Gone", "InvalidRequest", "NotFound",
    "ProblemError", "ServiceUnreachable", "StillRunning", "StreamFailed", "TaskCancelled", "TaskEnded",
    "TaskExpired", "TaskFailed", "TaskportError", "TooManyRequests", "Unauthorized", "Unavailable",
]
