"""The soak's checker: reads back everything acknowledged and judges it against what the service promises.

Each check returns the listing of what broke it (empty: it holds). The checks, as docs/self-healing.md
states the guarantees:

- ``ended``: every acknowledged task (and every task the schedule created) exists and ended COMPLETED: the
  load asks for nothing that may fail, so any other end is a fault turned into an outcome;
- ``items``: its items are counted once: ``items`` reads total == succeeded == the payload's count, failed 0,
  and an ``orders.split`` result ships every item exactly once;
- ``audit``: the ``{tp}:audit`` stream has, for each task, one creation, exactly one terminal transition, and
  no start that neither follows the creation nor a put-back (two runs at once);
- ``then``: every batch is DONE with all its tasks COMPLETED; its ``then`` task first started after the last
  of them ended, and its summary saw every task COMPLETED;
- ``callbacks``: every callback asked for reached the receiver at least once, always under one webhook id;
- ``files``: every export's file is there and byte-identical to what ``orders.export`` writes for its payload;
- ``schedule``: every fire time created one task at most, every task of the schedule belongs to a fire time,
  and a fire time passed without a task only while no scheduler could serve it;
- ``answers``: no submit answered outside the contract (a 409 DUPLICATE to a first sending, a 500).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import redis
import requests

from app.core import keys
from app.core.audit import EntryField
from app.core.schedules import fire_digest
from tests.soak.load import Acked, Ledger
from tests.unit.test_callbacks import Receiver
from workers.processors import orders_export

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED"}
MEMBER = "public"  # open mode's member


def expected_csv(rows: int) -> bytes:
    """What ``orders.export`` writes for ``{"rows": rows, "format": "csv"}``, from its own row function."""
    start, end = orders_export.date_range(None, None)
    span = (end - start).days + 1
    lines: list[Iterable[Any]] = [orders_export.HEADER]
    for i in range(rows):
        day = start + timedelta(days=i * span // rows)
        code, day, customer, items, cents, cur, status = orders_export.make_row(i, day)
        lines.append((code, day.isoformat(), customer, items, f"{cents // 100}.{cents % 100:02d}", cur, status))
    return orders_export._csv_bytes(lines)


def audit_by_task(conn: redis.Redis) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """Every audit entry, oldest first, by task: (stream id, fields)."""
    found: dict[str, list[tuple[str, dict[str, str]]]] = defaultdict(list)
    last = "-"
    while True:
        page: Any = conn.xrange(keys.AUDIT, min=last, max="+", count=5000)
        if last != "-":
            page = page[1:]
        if not page:
            return found
        for entry_id, fields in page:
            g = {k.decode(): v.decode() for k, v in fields.items()}
            found[g[EntryField.TASK]].append((entry_id.decode(), g))
        last = page[-1][0].decode()


def stream_order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


class Checker:
    def __init__(self, base_url: str, conn: redis.Redis, ledger: Ledger, receiver: Receiver) -> None:
        self.base_url = base_url
        self.conn = conn
        self.ledger = ledger
        self.receiver = receiver
        self.session = requests.Session()
        self.docs: dict[str, dict[str, Any]] = {}
        self.audit: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self.schedule_tasks: dict[str, Acked] = {}
        self.figures: dict[str, Any] = {}

    def get(self, path: str) -> requests.Response:
        return self.session.get(self.base_url + path, timeout=30)

    def read(self) -> None:
        """Read everything once: the audit stream, then every task's status document."""
        self.audit = audit_by_task(self.conn)
        tasks = {**self.ledger.tasks, **self.schedule_tasks}
        for task_id in tasks:
            answer = self.get(f"/api/v1/tasks/{task_id}")
            found = answer.status_code in (200, 410)
            self.docs[task_id] = answer.json() if found else {"status": f"HTTP {answer.status_code}"}

    # -- the checks --------------------------------------------------------------------------------
    def all_tasks(self) -> dict[str, Acked]:
        return {**self.ledger.tasks, **self.schedule_tasks}

    def ended(self) -> list[str]:
        bad = []
        for task_id, acked in self.all_tasks().items():
            doc = self.docs[task_id]
            if doc.get("status") != "COMPLETED":
                bad.append(f"{task_id} {acked.type} is {doc.get('status')} error={doc.get('error')} "
                           f"attempts={doc.get('attempts')} resumed={doc.get('resumed')} ({acked.how})")
        self.figures["ended"] = Counter(str(self.docs[t].get("status")) for t in self.all_tasks())
        return bad

    def items(self) -> list[str]:
        bad = []
        for task_id, acked in self.all_tasks().items():
            doc = self.docs[task_id]
            if doc.get("status") != "COMPLETED":
                continue  # judged by `ended`
            want = len(acked.payload["items"]) if acked.type == "orders.split" else acked.payload.get("items", 0)
            if not want:
                continue
            counts = doc.get("items")
            if counts != {"total": want, "succeeded": want, "failed": 0}:
                bad.append(f"{task_id} {acked.type}: items {counts}, {want} sent")
            if acked.type == "orders.split":
                result = self.get(f"/api/v1/tasks/{task_id}/result").json().get("result") or {}
                shipped = Counter(line["item_code"] for s in result.get("shipments", []) for line in s["items"])
                sent = Counter(item["item_code"] for item in acked.payload["items"])
                if shipped != sent:
                    bad.append(f"{task_id} orders.split: result ships {sum(shipped.values())} lines for {want} items "
                               f"(missing {sorted(sent - shipped)[:5]}, extra {sorted(shipped - sent)[:5]})")
        return bad

    def audit_trail(self) -> list[str]:
        bad = []
        for task_id, acked in self.all_tasks().items():
            if self.docs[task_id].get("status") not in TERMINAL:
                continue  # not ended: `ended` lists it
            entries = [g for _, g in self.audit.get(task_id, [])]
            moves = [(g[EntryField.FROM], g[EntryField.TO]) for g in entries]
            terminal = [m for m in moves if m[1] in TERMINAL]
            created = [m for m in moves if m[0] == ""]
            starts = sum(1 for m in moves if m[1] == "PROCESSING")
            putbacks = sum(1 for m in moves if m == ("PROCESSING", "PENDING"))
            problems = []
            if len(created) != 1:
                problems.append(f"{len(created)} creations")
            if len(terminal) != 1:
                problems.append(f"{len(terminal)} terminal transitions")
            if starts > putbacks + 1:
                problems.append(f"{starts} starts for {putbacks} put-backs")
            if problems:
                shown = " ".join(f"{a or '-'}>{b}" for a, b in moves)
                bad.append(f"{task_id} {acked.type}: {', '.join(problems)}: {shown}")
        return bad

    def then_tasks(self) -> list[str]:
        bad = []
        for batch_id, batch in self.ledger.batches.items():
            doc = self.get(f"/api/v1/batches/{batch_id}").json()
            size = len(batch["tasks"])
            counts = doc.get("counts") or {}
            if doc.get("status") != "DONE" or counts.get("COMPLETED") != size or any(
                    v for k, v in counts.items() if k != "COMPLETED"):
                bad.append(f"batch {batch_id}: {doc.get('status')} counts={counts} for {size} tasks")
            ends = [eid for t in batch["tasks"] for eid, g in self.audit.get(t, []) if g[EntryField.TO] in TERMINAL]
            starts = [eid for eid, g in self.audit.get(batch["then"], []) if g[EntryField.TO] == "PROCESSING"]
            if ends and starts and stream_order(starts[0]) < max(map(stream_order, ends)):
                bad.append(f"batch {batch_id}: its then task {batch['then']} started at {starts[0]}, before its last "
                           f"task ended at {max(ends, key=stream_order)}")
            if self.docs.get(batch["then"], {}).get("status") == "COMPLETED":
                answer = self.get(f"/api/v1/tasks/{batch['then']}/result")
                summary = answer.json().get("result") or {}
                seen = {t["task_id"]: t["status"] for t in summary.get("tasks", [])}
                if set(seen) != set(batch["tasks"]) or set(seen.values()) != {"COMPLETED"}:
                    bad.append(f"batch {batch_id}: its then task {batch['then']} summarized {seen} (HTTP "
                               f"{answer.status_code}, counts {summary.get('counts')})")
        return bad

    def callbacks(self) -> list[str]:
        by_subject: dict[Any, set[str]] = defaultdict(set)
        statuses: dict[Any, set[str]] = defaultdict(set)
        for headers, body, _ in list(self.receiver.got):
            document = json.loads(body)
            subject = document.get("batch_id") if "batch_id" in document and "task_id" not in document \
                else document.get("task_id")
            by_subject[subject].add(headers.get("webhook-id") or headers.get("Webhook-Id", "?"))
            statuses[subject].add(document.get("status"))
        # what ended (a task COMPLETED, a batch whose tasks all did); the rest is listed by `ended` already
        done = {t for t, d in self.docs.items() if d.get("status") == "COMPLETED"}
        wanted = [t for t, a in self.ledger.tasks.items() if a.callback and t in done] + [
            b for b, batch in self.ledger.batches.items() if set(batch["tasks"]) <= done]
        bad = []
        for subject in wanted:
            ids = by_subject.get(subject, set())
            if len(ids) != 1:
                bad.append(f"{subject}: {len(ids)} webhook ids {sorted(ids)} (statuses {sorted(statuses[subject])})")
        self.figures["callbacks"] = f"{len(wanted)} asked, {len(self.receiver.got)} deliveries received"
        return bad

    def files(self) -> list[str]:
        bad: list[str] = []
        expected: dict[int, bytes] = {}
        checked = 0
        for task_id, acked in self.all_tasks().items():
            if acked.type != "orders.export" or self.docs[task_id].get("status") != "COMPLETED":
                continue
            rows = acked.payload["rows"]
            want = expected.setdefault(rows, expected_csv(rows))
            answer = self.get(f"/api/v1/tasks/{task_id}/result/file")
            checked += 1
            if answer.status_code != 200:
                bad.append(f"{task_id} orders.export rows={rows}: file answered {answer.status_code} "
                           f"{answer.text[:120]}")
            elif answer.content != want:
                bad.append(f"{task_id} orders.export rows={rows}: {len(answer.content)} bytes "
                           f"(sha256 {hashlib.sha256(answer.content).hexdigest()[:12]}), want {len(want)}")
        self.figures["files"] = checked
        return bad

    def answers(self) -> list[str]:
        return list(self.ledger.anomalies)


def schedule_tasks(conn: redis.Redis, audit: dict[str, list[tuple[str, dict[str, str]]]], schedule_id: str,
                   fire_times: list[int], member: str = MEMBER) -> tuple[dict[int, str | None], set[str]]:
    """(fire time -> the task its dedup key names, or None; every task created with the schedule's payload)."""
    fired: dict[int, str | None] = {}
    for fire_ms in fire_times:
        held: Any = conn.get(keys.dedup(member, fire_digest(schedule_id, fire_ms)))
        fired[fire_ms] = held.decode() if held else None
    digests = set()
    for task_id in filter(None, fired.values()):
        for _, g in audit.get(task_id, []):
            if g[EntryField.FROM] == "" and g.get(EntryField.PAYLOAD):
                digests.add(g[EntryField.PAYLOAD])
    created = {task_id for task_id, entries in audit.items() for _, g in entries
               if g[EntryField.FROM] == "" and g[EntryField.TYPE] == "orders.export"
               and g.get(EntryField.PAYLOAD) in digests}
    return fired, created


def judge_schedule(fired: dict[int, str | None], created: set[str], outages: list[tuple[float, float]],
                   to_wall: float) -> list[str]:
    """Once per fire time: no task without its fire time, no fire time with two; a fire time without a task
    only within a scheduler outage (``outages``: monotonic intervals; ``to_wall`` turns them into epoch s)."""
    bad = []
    named = Counter(t for t in fired.values() if t)
    for task_id, count in named.items():
        if count > 1:
            bad.append(f"task {task_id} holds {count} fire times' keys")
    for extra in sorted(created - set(named)):
        bad.append(f"task {extra} was created with the schedule's payload but belongs to no fire time")
    for fire_ms, holder in sorted(fired.items()):
        at = fire_ms / 1000
        if holder is None and not any(start + to_wall - 2 <= at <= end + to_wall + 5 for start, end in outages):
            bad.append(f"fire time {fire_ms} created no task, and no scheduler outage covers it")
    return bad
