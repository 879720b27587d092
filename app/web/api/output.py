"""GET /api/v1/tasks/{id}/output: a task's live output lines (``ctx.emit``), for pollers.

``?after=<id>`` answers the lines after that one (none: from the oldest kept), at most ``limit`` (1 to 1000,
default 1000), as ``{"lines": [{"id", "at", "text"}], "next"}``. ``next`` is the cursor for the next call: the
last line's id, or the ``after`` sent when nothing is new; null once the task has ended and every line was
served. Lines trimmed at ``TASKPORT_OUTPUT_MAX_LINES`` are gone: the next line served is the oldest kept.
404 and 410 as a status read.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from app.core.clock import now_ms
from app.core.output import MAX_PAGE, OutputLog, Page, parse_id
from app.core.states import TERMINAL, TaskStatus
from app.core.urls import API_PREFIX, status_document
from app.web.api import json_response
from app.web.errors import ValidationFailed
from app.web.runtime import runtime

bp = Blueprint("output", __name__, url_prefix=API_PREFIX)
ENDED = TERMINAL | {TaskStatus.EXPIRED, ""}  # '': gone between the two reads


@bp.get("/tasks/<task_id>/output")
def output(task_id: str) -> Response:
    """The task's output lines after ``after``; 404/410 as for status."""
    after, limit = _query()
    rt = runtime()
    task = rt.service.find(rt.members.current(), task_id)
    now = now_ms()
    if task.effective_status(now) == TaskStatus.EXPIRED:
        return json_response(status_document(task, now), 410)
    page = OutputLog.of(rt.service.store).page(task_id, after, limit)
    return json_response({"lines": [line.doc() for line in page.lines], "next": next_cursor(page, after)})


def next_cursor(page: Page, after: int) -> str | None:
    """The cursor after ``page``: its last line's id (``after`` with no line), None once the task has ended and
    no line is left after it."""
    last_served = page.lines[-1].id if page.lines else after
    if page.status in ENDED and last_served >= page.last:
        return None
    return str(max(last_served, after))


def _query() -> tuple[int, int]:
    """(after, limit) from the query string; 422 naming whichever is not valid (an empty value too: the document's
    patterns refuse it, so ``?after=`` is not read as no ``after``)."""
    errors: dict[str, list[str]] = {}
    after = 0
    raw_after = request.args.get("after")
    if raw_after is not None:
        parsed = parse_id(raw_after)
        if parsed is None:
            errors["after"] = ["must be a line id from this task's output (or 0)"]
        else:
            after = parsed
    limit = MAX_PAGE
    raw_limit = request.args.get("limit")
    if raw_limit is not None:
        number = parse_id(raw_limit)
        if number is None or not 1 <= number <= MAX_PAGE:
            errors["limit"] = [f"must be an integer from 1 to {MAX_PAGE}"]
        else:
            limit = number
    if errors:
        raise ValidationFailed(errors)
    return after, limit
