"""The audit trail: reading the stream the transition scripts append to (see scripts.AUDIT).

Every status change of every task adds one entry to the capped stream ``keys.AUDIT`` in the same Lua
script that makes the change, so the trail can neither miss a transition nor record one that did not
happen. It outlives the tasks: retention is ``TASKPORT_AUDIT_RETENTION`` (an age and/or an entry
count), not the task's lifetime.

Reads go newest first, a page at a time; a page's cursor is the id of its last entry. Filtering by
task or member scans the stream (there is no index per task or member, which would double the write
cost of every transition): a page scans at most ``SCAN_BUDGET`` entries, and answers with a cursor
when the budget ran out, so a rare filter costs several calls, never one unbounded one.

``taskport audit [--task ID] [--member M] [--limit N] [--json]`` (app.launch.cli) prints the same entries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.core import keys
from app.core.clock import iso

BATCH = 500
SCAN_BUDGET = 20_000
MAX_LIMIT = 1000
CURSOR = re.compile(r"\d{1,20}-\d{1,20}")


class EntryField(StrEnum):
    """The fields of an audit entry: their only home. The audit fragment of the Lua scripts
    (:data:`app.core.scripts.AUDIT`) writes them as ``!name``; the reader below reads them by these members."""

    TASK = "task"
    MEMBER = "member"
    TYPE = "type"
    FROM = "from"  # the status the task left ('' at submit)
    TO = "to"
    CODE = "code"  # its error code, '' when none
    ATTEMPT = "attempt"
    PAYLOAD = "payload"  # the SHA-256 of the payload JSON, on the entries that make the task PENDING


_TASK, _MEMBER = EntryField.TASK.encode(), EntryField.MEMBER.encode()


@dataclass(frozen=True)
class AuditPage:
    entries: list[dict[str, Any]]
    next_cursor: str | None


def entry_doc(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One stream entry as the endpoint and the CLI show it."""
    g = {k.decode(): v.decode() for k, v in fields.items()}
    ident = entry_id.decode()
    code = g.get(EntryField.CODE, "")
    return {
        "id": ident, "at": iso(int(ident.split("-")[0])), "task_id": g.get(EntryField.TASK),
        "member": g.get(EntryField.MEMBER), "type": g.get(EntryField.TYPE), "from": g.get(EntryField.FROM) or None,
        "to": g.get(EntryField.TO), "error_code": int(code) if code else None,
        "attempt": int(g.get(EntryField.ATTEMPT) or 0), "payload_sha256": g.get(EntryField.PAYLOAD) or None,
    }  # fmt: skip


def read(conn: Any, *, task_id: str | None = None, member: str | None = None, limit: int = 100,
         cursor: str | None = None) -> AuditPage:
    """Up to ``limit`` entries, newest first, older than ``cursor`` (an entry id), matching the filters."""
    top = f"({cursor}" if cursor else "+"
    found: list[dict[str, Any]] = []
    scanned = 0
    while scanned < SCAN_BUDGET:
        rows = conn.xrevrange(keys.AUDIT, max=top, min="-", count=BATCH)
        for entry_id, fields in rows:
            scanned += 1
            top = f"({entry_id.decode()}"
            if (task_id and fields.get(_TASK, b"").decode() != task_id) or (
                    member and fields.get(_MEMBER, b"").decode() != member):
                continue
            found.append(entry_doc(entry_id, fields))
            if len(found) == limit:
                return AuditPage(found, entry_id.decode())
        if len(rows) < BATCH:
            return AuditPage(found, None)
    return AuditPage(found, top[1:])


def trim_by_age(conn: Any, max_age_s: int, now_ms: int) -> None:
    """Drop the entries older than ``max_age_s`` (0 = no age limit): whole stream nodes (``MINID ~``), cheap.
    Housekeeping's expiry pass runs it; the scripts' entries trim only by count (``MAXLEN ~``), so a
    transition does not pay a TIME and an XTRIM for it (app.core.scripts.AUDIT)."""
    if max_age_s > 0:
        conn.xtrim(keys.AUDIT, minid=str(now_ms - max_age_s * 1000), approximate=True)
