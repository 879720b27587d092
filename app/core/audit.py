"""The audit trail: reading the stream the transition scripts append to (see scripts.AUDIT).

Every status change of every task adds one entry to the capped stream ``keys.AUDIT`` in the same Lua
script that makes the change, so the trail can neither miss a transition nor record one that did not
happen. It outlives the tasks: retention is ``TASKPORT_AUDIT_RETENTION`` (an age and/or an entry
count), not the task's lifetime.

Reads go newest first, a page at a time; a page's cursor is the id of its last entry. Filtering by
task or member scans the stream (there is no index per task or member, which would double the write
cost of every transition): a page scans at most ``SCAN_BUDGET`` entries, and answers with a cursor
when the budget ran out, so a rare filter costs several calls, never one unbounded one.

``taskport audit [--task ID] [--member M] [--limit N] [--json]`` prints the same entries.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from app.core import keys
from app.core.clock import iso

BATCH = 500
SCAN_BUDGET = 20_000
MAX_LIMIT = 1000
CURSOR = re.compile(r"\d{1,20}-\d{1,20}")


@dataclass(frozen=True)
class AuditPage:
    entries: list[dict[str, Any]]
    next_cursor: str | None


def entry_doc(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One stream entry as the endpoint and the CLI show it."""
    g = {k.decode(): v.decode() for k, v in fields.items()}
    ident = entry_id.decode()
    code = g.get("code", "")
    return {
        "id": ident, "at": iso(int(ident.split("-")[0])), "task_id": g.get("task"), "member": g.get("member"),
        "type": g.get("type"), "from": g.get("from") or None, "to": g.get("to"),
        "error_code": int(code) if code else None, "attempt": int(g.get("attempt") or 0),
        "payload_sha256": g.get("payload") or None,
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
            if (task_id and fields.get(b"task", b"").decode() != task_id) or (
                    member and fields.get(b"member", b"").decode() != member):
                continue
            found.append(entry_doc(entry_id, fields))
            if len(found) == limit:
                return AuditPage(found, entry_id.decode())
        if len(rows) < BATCH:
            return AuditPage(found, None)
    return AuditPage(found, top[1:])


def add_parser(sub: Any) -> None:
    """Register ``taskport audit`` on the CLI's subparsers."""
    p = sub.add_parser("audit", help="print the audit trail of task transitions, newest first")
    p.add_argument("--task", help="only this task id")
    p.add_argument("--member", help="only this member's tasks")
    p.add_argument("--limit", type=int, default=100, help="at most this many entries (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(run=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """``taskport audit``: read the audit stream of the Redis in REDIS_URL."""
    import redis

    from app.core.config import Config
    from app.core.connection import connect

    config = Config.from_env()
    if not config.redis_url:
        print("taskport: error: set REDIS_URL to the service's Redis", file=sys.stderr)
        return 2
    try:
        page = read(connect(config), task_id=args.task, member=args.member, limit=max(1, min(args.limit, MAX_LIMIT)))
    except redis.exceptions.ConnectionError as exc:
        print(f"taskport: error: Redis unreachable: {exc}", file=sys.stderr)
        return 1
    for e in page.entries:
        if args.json:
            print(orjson.dumps(e).decode())
        else:
            code = "" if e["error_code"] is None else f" code={e['error_code']}"
            print(f"{e['at']} {e['task_id']} {e['member']} {e['type']} {e['from'] or '-'} -> {e['to']}"
                  f" attempt={e['attempt']}{code} payload={e['payload_sha256']}")
    if page.next_cursor:
        print("(more: older entries exist; narrow with --task/--member or raise --limit)", file=sys.stderr)
    return 0
