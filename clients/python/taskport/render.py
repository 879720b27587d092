"""How the CLI shows documents to a person (rich): the live progress bar, status, result, history, batches.

Why rich: one well-kept library gives the live bar (redrawn in place on a terminal, printed once
when the output is a pipe or a log) and the tables, with no terminal code of our own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from taskport.states import TaskStatus

Doc = dict[str, Any]
MAX_FAILURE_ROWS = 50  # the table shows this many failures; the rest are counted
PIPE_WIDTH = 200  # columns when stdout is not a terminal: ids and times are never cut in a pipe or a log


def stdout() -> Console:
    """The console for results: the terminal's width, or a wide one when piped (rich's 80 cuts task ids)."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=PIPE_WIDTH)


def counts(doc: Doc) -> str:
    """``18 ok, 2 failed of 20`` or an empty string for a task without items."""
    items = doc.get("items")
    if not items:
        return ""
    return f"{items['succeeded']} ok, {items['failed']} failed of {items['total']}"


def resumed(doc: Doc) -> str:
    """``2 times from a checkpoint`` when the task's runs resumed, else an empty string (the row is left out:
    a task that never stopped midway, and a service older than the field, show nothing)."""
    times = doc.get("resumed") or 0
    if times <= 0:
        return ""
    return f"{times} time{'' if times == 1 else 's'} from a checkpoint"


def queued(doc: Doc) -> str:
    """``queued: 3 ahead, starts ~12:01:05`` (local time) for a PENDING task in its queue, ``queued: next`` when
    none is ahead, no time until the queue has a measured rate; an empty string for any other document."""
    place = doc.get("queue") if doc.get("status") == TaskStatus.PENDING else None
    if not place:
        return ""
    position = place.get("position") or 0
    text = f"queued: {position} ahead" if position else "queued: next"
    start = place.get("estimated_start")
    if start:
        text += f", starts ~{datetime.fromisoformat(start.replace('Z', '+00:00')).astimezone():%H:%M:%S}"
    return text


def progress(docs: Iterable[Doc], console: Console) -> Doc | None:
    """Show a live bar (percent, status, item counts, and the message, or the place in line while the task
    waits in its queue) while ``docs`` come; return the last."""
    return _bar(docs, console, TaskStatus.PENDING.value,
                lambda doc: (counts(doc), queued(doc) or doc.get("message") or ""))


def output_line(line: Doc, console: Console) -> None:
    """One line of a task's output, as the processor wrote it: above a live bar on a terminal (rich keeps the bar
    last), as it comes in a pipe."""
    console.print(line["text"], markup=False, emoji=False, highlight=False, soft_wrap=True)


def batch_progress(docs: Iterable[Doc], console: Console) -> Doc | None:
    """The same bar for a batch's documents: percent, status, its tasks by status; return the last."""
    return _bar(docs, console, "RUNNING", lambda doc: (batch_counts(doc), ""))


def _bar(docs: Iterable[Doc], console: Console, first: str, texts: Callable[[Doc], tuple[str, str]]) -> Doc | None:
    columns = (TextColumn("{task.fields[status]:<10}"), BarColumn(bar_width=30), TaskProgressColumn(),
               TextColumn("{task.fields[counts]}"), TextColumn("{task.description}"))
    last: Doc | None = None
    with Progress(*columns, console=console, transient=False) as bar:
        job = bar.add_task("", total=100, status=first, counts="")
        for doc in docs:
            last = doc
            shown, description = texts(doc)
            bar.update(job, completed=doc["progress"], description=description, status=doc["status"], counts=shown)
    return last


def status(doc: Doc, console: Console | None = None) -> None:
    """A status document as aligned lines."""
    out = console or stdout()
    error = doc.get("error")
    rows = [("task", doc["task_id"]), ("type", doc["type"]), ("status", doc["status"]),
            ("progress", f"{doc['progress']}%"), ("message", doc.get("message") or ""), ("items", counts(doc)),
            ("error", f"{error['code']}: {error['message']}" if error else ""), ("resumed", resumed(doc)),
            ("queue", queued(doc).removeprefix("queued: ")),
            ("created", doc.get("created_at") or ""), ("updated", doc.get("updated_at") or ""),
            ("expires", doc.get("expires_at") or "")]
    for name, value in rows:
        if value:
            out.print(f"{name:<9} {value}", markup=False, soft_wrap=True)


def result(doc: Doc, console: Console | None = None) -> None:
    """A result document: the outcome line, the failure table (if any) and the processor's output."""
    out = console or stdout()
    line = f"{doc['status']} {doc['task_id']}"
    if counts(doc):
        line += f"  items: {counts(doc)}"
    if doc.get("error_code") is not None:
        line += f"  error_code: {doc['error_code']}"
    out.print(line, markup=False, soft_wrap=True)
    failures = doc.get("failures") or []
    if failures:
        table = Table("item", "code", "message", title="failed items", title_justify="left")
        for failure in failures[:MAX_FAILURE_ROWS]:
            table.add_row(str(failure["item"]), str(failure["code"]), str(failure["message"]))
        out.print(table)
        if len(failures) > MAX_FAILURE_ROWS:
            out.print(f"... and {len(failures) - MAX_FAILURE_ROWS} more (--json shows them all)")
    out.print("result: " + json.dumps(doc.get("result"), ensure_ascii=False), markup=False, soft_wrap=True)


def ended(doc: Doc, console: Console) -> None:
    """A task that ended without a result (FAILED, CANCELLED, EXPIRED), on stderr."""
    error = doc.get("error")
    text = f"{doc['status']} {doc['task_id']}"
    if error:
        text += f" with code {error['code']}: {error['message']}"
    console.print(text, markup=False, soft_wrap=True)


def history(docs: list[Doc], console: Console | None = None) -> None:
    """Tasks as a table, newest first."""
    out = console or stdout()
    if not docs:
        out.print("no tasks")
        return
    table = Table()
    table.add_column("task", no_wrap=True, min_width=36)
    for name in ("type", "status", "progress", "items"):
        table.add_column(name)
    table.add_column("created", no_wrap=True)
    for doc in docs:
        table.add_row(doc["task_id"], doc["type"], doc["status"], f"{doc['progress']}%", counts(doc),
                      doc.get("created_at") or "")
    out.print(table)


def batch_counts(doc: Doc) -> str:
    """A batch's tasks by status, ``18 completed, 1 failed, 1 processing of 20`` (statuses with none left out)."""
    shown = [f"{number} {status.lower()}" for status, number in (doc.get("counts") or {}).items() if number]
    return f"{', '.join(shown) or 'none'} of {doc['size']}"


def callback_state(doc: Doc) -> str:
    """``delivered after 3 attempts (last answer 204)``, or an empty string when there is no callback."""
    callback = doc.get("callback")
    if not callback:
        return ""
    attempts = callback.get("attempts") or 0
    text = str(callback["state"])
    if attempts:
        text += f" after {attempts} attempt{'' if attempts == 1 else 's'}"
    return text + (f" (last answer {callback['last_status']})" if callback.get("last_status") else "")


def batch(doc: Doc, console: Console | None = None) -> None:
    """A batch document as aligned lines (empty fields left out)."""
    out = console or stdout()
    rows = [("batch", doc["batch_id"]), ("status", doc["status"]), ("progress", f"{doc['progress']}%"),
            ("tasks", batch_counts(doc)), ("items", counts(doc) if (doc.get("items") or {}).get("total") else ""),
            ("then", doc.get("then_task_id") or ""), ("callback", callback_state(doc)),
            ("created", doc.get("created_at") or ""), ("completed", doc.get("completed_at") or ""),
            ("expires", doc.get("expires_at") or "")]
    for name, value in rows:
        if value:
            out.print(f"{name:<9} {value}", markup=False, soft_wrap=True)
