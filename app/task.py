"""The task record as stored (a flat Redis hash) and its rendering as the contract's status document.

Rendering is a plain function on the hot path of every status read: no schema library, no extra I/O.
Timestamps are stored as fixed-width ISO 8601 UTC strings, so comparing two of them as strings
compares the instants.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.states import ACTIVE, ERROR_MESSAGES, ErrorCode, TaskStatus

API_PREFIX = "/api/v1"


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ``2026-11-29T10:00:00.120Z``."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def ms_of(stamp: str) -> int:
    """The inverse of :func:`iso`."""
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def task_path(task_id: str) -> str:
    return f"{API_PREFIX}/tasks/{task_id}"


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    text = value.decode()
    return text or None


def _int(value: bytes | None, default: int | None = 0) -> int | None:
    return int(value) if value else default


@dataclass(frozen=True, slots=True)
class Task:
    """One task as read from its hash (see :func:`app.store.TaskStore.new_fields` for the writer)."""

    id: str
    type: str
    member: str
    status: str
    progress: int
    message: str | None
    items: dict[str, int] | None
    error_code: int | None
    error_message: str | None
    attempts: int
    max_attempts: int
    priority: str
    created_at: str
    started_at: str | None
    updated_at: str
    completed_at: str | None
    expires_at: str
    run_id: str | None
    seq: int

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes], task_id: str) -> Task:
        """The task stored in hash ``h`` under ``task_id`` (the id is the key's, not a field)."""
        g = h.get
        total = g(b"items_total")
        items = None
        if total:
            items = {
                "total": int(total),
                "succeeded": int(g(b"items_succeeded") or 0),
                "failed": int(g(b"items_failed") or 0),
            }
        return cls(
            id=task_id,
            type=h[b"type"].decode(),
            member=h[b"member"].decode(),
            status=h[b"status"].decode(),
            progress=int(g(b"progress") or 0),
            message=_text(g(b"message")),
            items=items,
            error_code=_int(g(b"error_code"), None),
            error_message=_text(g(b"error_message")),
            attempts=int(g(b"attempts") or 0),
            max_attempts=int(g(b"max_attempts") or 1),
            priority=(g(b"priority") or b"default").decode(),
            created_at=h[b"created_at"].decode(),
            started_at=_text(g(b"started_at")),
            updated_at=h[b"updated_at"].decode(),
            completed_at=_text(g(b"completed_at")),
            expires_at=h[b"expires_at"].decode(),
            run_id=_text(g(b"run_id")),
            seq=int(g(b"seq") or 0),
        )

    def effective_status(self, now_iso: str) -> str:
        """The status a reader sees: EXPIRED once ``expires_at`` has passed, before housekeeping runs."""
        if self.status != TaskStatus.EXPIRED and now_iso >= self.expires_at:
            return TaskStatus.EXPIRED
        return self.status

    def error(self, now_iso: str) -> dict[str, Any] | None:
        if self.status in ACTIVE and now_iso >= self.expires_at:
            return {"code": ErrorCode.EXPIRED, "message": ERROR_MESSAGES[ErrorCode.EXPIRED]}
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message or ""}

    def to_doc(self, now_iso: str) -> dict[str, Any]:
        """The contract's status document."""
        path = task_path(self.id)
        return {
            "task_id": self.id,
            "type": self.type,
            "status": self.effective_status(now_iso),
            "progress": self.progress,
            "message": self.message,
            "items": self.items,
            "error": self.error(now_iso),
            "attempts": self.attempts,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "completed_at": self.completed_at,
            "expires_at": self.expires_at,
            "links": {"self": path, "result": f"{path}/result", "events": f"{path}/events"},
        }
