"""The task record as stored (a flat Redis hash) and its rendering as the contract's status document.

Rendering is a plain function on the hot path of every status read: no schema library, no extra I/O.
Timestamps are stored as integer milliseconds since the epoch (Redis keeps an integer in a compact
hash in a few bytes, a 24-character ISO string in 25) and rendered as ISO 8601 only in documents.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app.states import ACTIVE, ERROR_MESSAGES, ErrorCode, TaskStatus

API_PREFIX = "/api/v1"


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ``2026-11-29T10:00:00.120Z``."""
    seconds, milli = divmod(ms, 1000)
    t = time.gmtime(seconds)
    return f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d}T{t[3]:02d}:{t[4]:02d}:{t[5]:02d}.{milli:03d}Z"


def iso_or_none(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)


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
    created_at: int  # ms since the epoch, like every time here
    started_at: int | None
    updated_at: int
    completed_at: int | None
    expires_at: int
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
            created_at=int(h[b"created_at"]),
            started_at=_int(g(b"started_at"), None),
            updated_at=int(h[b"updated_at"]),
            completed_at=_int(g(b"completed_at"), None),
            expires_at=int(h[b"expires_at"]),
            run_id=_text(g(b"run_id")),
            seq=int(g(b"seq") or 0),
        )

    def effective_status(self, now: int) -> str:
        """The status a reader sees at ``now`` (ms): EXPIRED once ``expires_at`` has passed, before
        housekeeping runs."""
        if self.status != TaskStatus.EXPIRED and now >= self.expires_at:
            return TaskStatus.EXPIRED
        return self.status

    def error(self, now: int) -> dict[str, Any] | None:
        if self.status in ACTIVE and now >= self.expires_at:
            return {"code": ErrorCode.EXPIRED, "message": ERROR_MESSAGES[ErrorCode.EXPIRED]}
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message or ""}

    def to_doc(self, now: int) -> dict[str, Any]:
        """The contract's status document as seen at ``now`` (ms)."""
        path = task_path(self.id)
        return {
            "task_id": self.id,
            "type": self.type,
            "status": self.effective_status(now),
            "progress": self.progress,
            "message": self.message,
            "items": self.items,
            "error": self.error(now),
            "attempts": self.attempts,
            "created_at": iso(self.created_at),
            "started_at": iso_or_none(self.started_at),
            "updated_at": iso(self.updated_at),
            "completed_at": iso_or_none(self.completed_at),
            "expires_at": iso(self.expires_at),
            "links": {"self": path, "result": f"{path}/result", "events": f"{path}/events"},
        }
