"""What every result store shares: its error, its description of a file, the file a resumable writer hands
out (:class:`ResumableFile`), and the checks of the ids and names it is handed. :mod:`app.core.results`
(the interface, the local store, the factory) and :mod:`app.core.s3store` both import it, so the two
stores depend on it and not on each other: results imports s3store (lazily, in its factory), never the
other way round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.ids import is_run_id, is_task_id

# A plain file name: no separators, no leading dot (so never "." / ".." and never a temp file).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class StoreUnavailable(Exception):
    """The result store cannot be reached (network, timeout, a 5xx from the server): worth retrying."""


@dataclass(frozen=True)
class FileInfo:
    """What the API needs to describe and serve a result file."""

    name: str
    size: int
    content_type: str


class ResumableFile(Protocol):
    """A result file being written that survives its run: what :meth:`app.core.results.ResultStore.resumable`
    hands out. ``durable()`` says how many bytes would survive a crash now, with a JSON-able token for them;
    a writer opened with that token continues after those bytes (``resumed``), or from nothing (0) when the
    token no longer matches what the store holds. The caller, which can restart only at a boundary of its
    own (a row) at or before ``resumed``, says where with ``resume_at`` and writes again from there: the
    bytes up to ``resumed`` must be the same ones as before (the writer may skip them rather than write them
    twice)."""

    @property
    def name(self) -> str:
        """A local path in the task's scratch or result folder, beside which temporary files may go."""
        ...

    @property
    def resumed(self) -> int:
        """How many durable bytes of an earlier run this writer continues after (0: it started over)."""
        ...

    def write(self, data: Any) -> int:
        ...

    def tell(self) -> int:
        """The bytes written so far, counting the ones resumed."""
        ...

    def durable(self) -> tuple[int, Any]:
        """``(bytes, token)``: how many of the bytes written would survive a crash now, and the token that
        resumes after them (None while nothing is durable). On disk this syncs the file; on S3 the finished
        parts are durable, the part still in the buffer is not."""
        ...

    def resume_at(self, offset: int) -> None:
        """Before the first write: continue at ``offset`` (0 <= offset <= resumed) rather than at ``resumed``;
        the next ``resumed - offset`` bytes written are the ones already there (ValueError otherwise)."""
        ...


def check_task_id(task_id: str) -> str:
    """Return ``task_id`` if it has a task id's shape (app.core.ids), else raise ValueError."""
    if not is_task_id(task_id):
        raise ValueError("invalid task id for result storage")
    return task_id


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it has a run id's shape (app.core.ids), else raise ValueError."""
    if not is_run_id(run_id):
        raise ValueError("invalid run id for result storage")
    return run_id


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain file name (no path, no leading dot), else raise ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("invalid result file name")
    return name
