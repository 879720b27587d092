"""``orders.export``: write ``rows`` generated orders to a CSV or XLSX file in result storage.

The rows are a pure function of (row number, date range), so the same payload always produces the
same file. Dates spread evenly over ``start_date``..``end_date`` in ascending order; without dates
the range is ``DEFAULT_START`` plus one year, with only one of them the range is one year long
(365 days) ending or starting there. The file is written through the result store, so a
cancelled or failed export leaves no file behind.

A CSV export resumes where an interrupted run (a graceful stop, a crash) left it. It writes through
``ctx.results.resumable``; after a chunk, at most once per ``ctx.interval`` and once more when the run
stops, it asks the writer how many bytes are durable (on disk: synced; on S3: in finished multipart parts)
and saves as its cursor the last row boundary at or before them, ``{"row", "byte", "file": token}``. The
next run opens the writer with that token; when the writer continued after the durable bytes, the export
regenerates the rows from the cursor's row (rows are a pure function of their number, so they are the same
bytes) and the writer cuts back to, or skips up to, the cursor's byte; when the token no longer matches
(the file or upload is gone) it starts over from row 0. The finished file is byte-identical either way.

An XLSX export always starts from scratch, whatever cursor there is: openpyxl's write-only workbook is a
zip archive whose sheet is streamed to a temporary file and packed, with the archive's central directory,
only by ``save`` at the very end, so no prefix of the output is ever final and there is nothing to append to.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io
import os
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any, BinaryIO

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.processors import processor
from app.core.resultbase import ResumableFile
from workers.context import TaskContext
from workers.exceptions import TaskInterrupted

MAX_ROWS = 1_000_000
CHUNK_ROWS = 1000  # rows written between two progress calls
# A CSV export's cursor saves (each syncs the file on disk) are at most one per progress write interval
# (ctx.interval, TASKPORT_PROGRESS_INTERVAL): a cursor saved more often would wait for the next write anyway.
DEFAULT_START = date(2026, 1, 1)
DEFAULT_SPAN_DAYS = 365
# Bounds of the payload's dates: order dates of this century and the next, at most ten years in one
# export. Without them 0001-01-01..9999-12-31 cost seconds of CPU whatever ``rows`` is, and a date near
# 9999-12-31 overflowed when the default one-year span was added to it.
MIN_DATE = date(1900, 1, 1)
MAX_DATE = date(2100, 12, 31)
MAX_SPAN_DAYS = 3660
HEADER = ("order_code", "order_date", "customer", "items", "amount", "currency", "status")
STATUSES = ("paid", "shipped", "delivered", "refunded", "cancelled")
CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

Row = tuple[str, date, str, int, int, str, str]  # amount in cents
# What the OpenAPI document says of the dates (app.web.api.docs): an RFC 3339 full-date within the bounds above.
DATE = {"format": "date", "pattern": r"^(19[0-9]{2}|20[0-9]{2}|2100)-[0-9]{2}-[0-9]{2}$",
        "description": f"YYYY-MM-DD, {MIN_DATE.isoformat()} to {MAX_DATE.isoformat()}"}


def _check_date(value: str) -> None:
    if not _ISO_DATE.fullmatch(value):
        raise ValidationError("Not a valid date: use YYYY-MM-DD.")
    try:
        day = date.fromisoformat(value)
    except ValueError as exc:
        raise ValidationError("Not a valid date: use YYYY-MM-DD.") from exc
    if not MIN_DATE <= day <= MAX_DATE:
        raise ValidationError(f"Must be between {MIN_DATE.isoformat()} and {MAX_DATE.isoformat()}.")


class ExportSchema(Schema):
    rows = fields.Integer(required=True, strict=True, validate=validate.Range(1, MAX_ROWS))
    format = fields.String(load_default="csv", validate=validate.OneOf(sorted(CONTENT_TYPES)))
    start_date = fields.String(validate=_check_date, metadata=DATE)
    end_date = fields.String(validate=_check_date, metadata=DATE)

    @validates_schema(skip_on_field_errors=True)
    def _range(self, data: dict, **kwargs: Any) -> None:
        start, end = data.get("start_date"), data.get("end_date")
        if start and end and end < start:  # ISO dates compare correctly as strings
            raise ValidationError("Must not be earlier than start_date.", field_name="end_date")
        if start and end and (date.fromisoformat(end) - date.fromisoformat(start)).days >= MAX_SPAN_DAYS:
            raise ValidationError(f"Must be less than {MAX_SPAN_DAYS} days after start_date.", field_name="end_date")


@processor("orders.export", schema=ExportSchema, timeout=3600)
def export(payload: dict, ctx: TaskContext) -> dict:
    """Write the export file and describe it; progress reads "row 4500 of 10000". A CSV export resumes from
    its cursor, an XLSX export starts over (the module docstring says how and why)."""
    rows, fmt = payload["rows"], payload["format"]
    start, end = date_range(payload.get("start_date"), payload.get("end_date"))
    name = f"orders_{start.isoformat()}_{end.isoformat()}.{fmt}"
    if fmt == "csv":
        _export_csv(ctx, name, rows, start, end)
    else:
        with ctx.results.writer(ctx.task_id, name) as fh:
            _write_xlsx(fh, (chunk for _, chunk in _chunks(rows, start, end, ctx)))
    info = ctx.results.info(ctx.task_id, name, CONTENT_TYPES[fmt])
    file = {
        "name": info.name,
        "size": info.size,
        "content_type": info.content_type,
    }  # the result read adds its "url" (app.web.api.tasks)
    return {"rows": rows, "file": file}


def date_range(start: str | None, end: str | None) -> tuple[date, date]:
    """The export's first and last date from the optional payload dates."""
    span = timedelta(days=DEFAULT_SPAN_DAYS - 1)
    if start and end:
        return date.fromisoformat(start), date.fromisoformat(end)
    if start:
        return date.fromisoformat(start), date.fromisoformat(start) + span
    if end:
        return date.fromisoformat(end) - span, date.fromisoformat(end)
    return DEFAULT_START, DEFAULT_START + span


def make_row(index: int, day: date) -> Row:
    """Row ``index`` (0-based) of an export: every column derives from the index alone."""
    h = (index * 2654435761) & 0xFFFFFFFF  # Knuth's multiplicative hash: cheap, spread, repeatable
    return (
        f"ORD-{index + 1:07d}",
        day,
        f"CUST-{(h >> 8) % 1000 + 1:04d}",
        (h >> 4) % 9 + 1,
        h % 99_900 + 100,
        "EUR",
        STATUSES[(h >> 16) % len(STATUSES)],
    )


def _chunks(rows: int, start: date, end: date, ctx: TaskContext, first: int = 0) -> Iterator[tuple[int, list[Row]]]:
    """``(rows so far, chunk)`` from row ``first`` on, in chunks of ``CHUNK_ROWS``, reporting progress after
    each chunk has been written."""
    span = (end - start).days + 1
    for begin in range(first, rows, CHUNK_ROWS):
        last = min(begin + CHUNK_ROWS, rows)
        yield last, [make_row(i, start + timedelta(days=i * span // rows)) for i in range(begin, last)]
        ctx.progress(last, rows, f"row {last} of {rows}")


def _export_csv(ctx: TaskContext, name: str, rows: int, start: date, end: date) -> None:
    """Write the CSV file, continuing from the cursor an interrupted run saved (see the module docstring)."""
    cursor = ctx.cursor if _is_cursor(ctx.cursor) else None
    token = cursor["file"] if cursor is not None else None
    with ctx.results.resumable(ctx.task_id, name, token, keep_on=(TaskInterrupted,)) as fh:
        cursors = _Cursors(ctx, fh, _restart(fh, cursor))
        try:
            for last, chunk in _chunks(rows, start, end, ctx, cursors.first):
                fh.write(_csv_bytes(
                    (code, day.isoformat(), customer, items, f"{cents // 100}.{cents % 100:02d}", cur, status)
                    for code, day, customer, items, cents, cur, status in chunk))
                cursors.passed(last)
        except TaskInterrupted:
            cursors.stopping()
            raise


def _is_cursor(value: Any) -> bool:
    return (isinstance(value, dict) and type(value.get("row")) is int and type(value.get("byte")) is int
            and value["row"] >= 0 and value["byte"] > 0 and "file" in value)


def _restart(fh: ResumableFile, cursor: dict[str, Any] | None) -> int:
    """The row to go on from: the cursor's when the writer resumed after its byte, else 0 (the header first)."""
    if cursor is not None and cursor["byte"] <= fh.resumed:
        fh.resume_at(cursor["byte"])
        return int(cursor["row"])
    fh.resume_at(0)
    fh.write(_csv_bytes([HEADER]))
    return 0


def _csv_bytes(rows: Any) -> bytes:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    return text.getvalue().encode("utf-8")


class _Cursors:
    """The cursor saves of a CSV export: the row boundaries ``(row, byte)`` written since the last durable
    one, and at most one save per ``ctx.interval`` of the last of them at or before the durable bytes."""

    def __init__(self, ctx: TaskContext, fh: ResumableFile, first: int) -> None:
        self.ctx, self.fh, self.first = ctx, fh, first
        self.marks = collections.deque([(first, fh.tell())])
        self.saved = self.marks[0]
        self.due = time.monotonic() + self.ctx.interval

    def passed(self, row: int) -> None:
        """Rows up to ``row`` are written (handed to the writer, not necessarily durable)."""
        self.marks.append((row, self.fh.tell()))
        if time.monotonic() >= self.due:
            self.save()

    def save(self) -> None:
        self.due = time.monotonic() + self.ctx.interval
        durable, token = self.fh.durable()
        marks = self.marks
        while len(marks) > 1 and marks[1][1] <= durable:
            marks.popleft()
        row, byte = marks[0]
        if token is None or byte > durable or (row, byte) == self.saved:
            return  # nothing durable yet, or nothing new
        self.saved = (row, byte)
        self.ctx.save_cursor({"row": row, "byte": byte, "file": token})

    def stopping(self) -> None:
        """The run stops (TaskInterrupted): save how far it got now. A cancel meanwhile raises TaskCancelled,
        and the writer then removes the file."""
        with contextlib.suppress(TaskInterrupted):
            self.save()


def _write_xlsx(fh: BinaryIO, chunks: Iterator[list[Row]]) -> None:
    """The workbook; never resumed (the module docstring says why)."""
    from openpyxl import Workbook  # imported on first use: it would weigh on every forked work horse

    book = Workbook(write_only=True)
    sheet = book.create_sheet("orders")
    try:
        with _temp_files_beside(fh):  # the sheet's own temp file appears at its first row
            sheet.append(HEADER)
            for chunk in chunks:
                for code, day, customer, items, cents, cur, status in chunk:
                    sheet.append((code, day, customer, items, cents / 100, cur, status))
        book.save(fh)
    except BaseException:
        _discard(sheet)
        raise


@contextlib.contextmanager
def _temp_files_beside(fh: BinaryIO) -> Iterator[None]:
    """Have openpyxl create the temporary file it streams a write-only sheet into in the task's own
    result folder (beside ``fh``), not in /tmp: whatever removes that folder (a cancel's cleanup after
    the work horse was killed, expiry) then removes it too. A worker runs one task at a time."""
    name = getattr(fh, "name", None)
    folder = os.path.dirname(name) if isinstance(name, str) else None
    saved = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _discard(sheet: Any) -> None:
    """Remove the temporary file openpyxl streams a write-only sheet into when the export stops early.

    openpyxl deletes it only in ``save`` or at interpreter exit, and a forked RQ work horse leaves
    through ``os._exit`` (no atexit), so a cancelled export would leak it. Best effort, private API.
    """
    with contextlib.suppress(Exception):
        if not sheet.closed:
            sheet.close()
        writer = getattr(sheet, "_writer", None)
        if writer is not None and isinstance(writer.out, str):
            writer.cleanup()
