"""``orders.export``: write ``rows`` generated orders to a CSV or XLSX file in result storage.

The rows are a pure function of (row number, date range), so the same payload always produces the
same file. Dates spread evenly over ``start_date``..``end_date`` in ascending order; without dates
the range is ``DEFAULT_START`` plus one year, with only one of them the range is one year long
(365 days) ending or starting there. The file is written through ``ctx.results.writer``, so a
cancelled or failed export leaves no file behind.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from typing import Any, BinaryIO

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.processors import processor
from workers.context import TaskContext

MAX_ROWS = 1_000_000
CHUNK_ROWS = 1000  # rows written between two progress calls
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
    """Write the export file and describe it; progress reads "row 4500 of 10000"."""
    rows, fmt = payload["rows"], payload["format"]
    start, end = date_range(payload.get("start_date"), payload.get("end_date"))
    name = f"orders_{start.isoformat()}_{end.isoformat()}.{fmt}"
    write: Callable[[BinaryIO, Iterator[list[Row]]], None] = _write_csv if fmt == "csv" else _write_xlsx
    with ctx.results.writer(ctx.task_id, name) as fh:
        write(fh, _chunks(rows, start, end, ctx))
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


def _chunks(rows: int, start: date, end: date, ctx: TaskContext) -> Iterator[list[Row]]:
    """Rows in chunks of ``CHUNK_ROWS``, reporting progress after each chunk has been written."""
    span = (end - start).days + 1
    for first in range(0, rows, CHUNK_ROWS):
        last = min(first + CHUNK_ROWS, rows)
        yield [make_row(i, start + timedelta(days=i * span // rows)) for i in range(first, last)]
        ctx.progress(last, rows, f"row {last} of {rows}")


def _write_csv(fh: BinaryIO, chunks: Iterator[list[Row]]) -> None:
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    try:
        out = csv.writer(text)
        out.writerow(HEADER)
        for chunk in chunks:
            out.writerows(
                (code, day.isoformat(), customer, items, f"{cents // 100}.{cents % 100:02d}", cur, status)
                for code, day, customer, items, cents, cur, status in chunk
            )
        text.flush()
    finally:
        text.detach()  # the result store owns (and closes) the binary file


def _write_xlsx(fh: BinaryIO, chunks: Iterator[list[Row]]) -> None:
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
