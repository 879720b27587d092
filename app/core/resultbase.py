"""What every result store shares: its error, its description of a file, and the checks of the ids and
names it is handed. :mod:`app.core.results` (the interface, the local store, the factory) and
:mod:`app.core.s3store` both import it, so the two stores depend on it and not on each other: results
imports s3store (lazily, in its factory), never the other way round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
