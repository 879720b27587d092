"""taskport's client side: a Python client (:mod:`taskport.client`) and the client commands of the
``taskport`` CLI (:mod:`taskport.cli`).

It is a distribution of its own, taskport-client (clients/python/ in the repository), which the service's
depends on. It imports neither Flask nor Redis nor anything of ``app``/``workers``: the status names and
error codes it spells as the service does are in :mod:`taskport.states`, a copy that a test holds equal to
the service's. A script that only talks to a taskport service over HTTP needs httpx, httpx-sse (and rich
for the CLI), nothing else (tests/unit/test_imports.py, tests/integration/test_client_dist.py).
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
