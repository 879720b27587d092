"""/api/v1/schedules: periodic schedules of the calling member (create, list, read, change, delete).

Each fire time of a schedule submits its ``task`` (workers.firing, in the scheduler process). The task is
checked here like a submit: its type and payload by the processor's schema (the submit view's own check),
its priority by the caller's grant.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app
from marshmallow import Schema, ValidationError

from app.core import processors
from app.core.clock import now_ms
from app.core.urls import API_PREFIX
from app.web.api import json_response
from app.web.api.tasks import NOT_A_CURSOR, _json_body, page_query
from app.web.errors import ValidationFailed
from app.web.intake import load_callback, validated_payload
from app.web.runtime import runtime
from app.web.schedule_schemas import ScheduleCreateSchema, ScheduleQuerySchema, ScheduleUpdateSchema
from app.web.schedule_service import ScheduleService, schedule_document, schedule_path

bp = Blueprint("schedules", __name__, url_prefix=API_PREFIX)
EXTENSION = "taskport.schedules"
_create_schema, _update_schema, _query_schema = ScheduleCreateSchema(), ScheduleUpdateSchema(), ScheduleQuerySchema()


def _service() -> ScheduleService:
    service = current_app.extensions.get(EXTENSION)
    if service is None:
        rt = runtime()
        service = current_app.extensions[EXTENSION] = ScheduleService(rt.redis, rt.config)
    return service  # type: ignore[no-any-return]


def _load(schema: Schema, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` loaded by ``schema``, its ``task`` (if any) checked like a submit; 422 naming each field."""
    try:
        data: dict[str, Any] = schema.load(body)
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages)) from None
    if "task" in data:
        task = data["task"]
        runtime().members.check_priority(task["priority"])
        try:
            task["payload"] = validated_payload(task["type"], task["payload"])
            if task.get("callback") is not None:
                task["callback"] = load_callback(task["callback"], runtime().members.current(), runtime().config)
        except ValidationFailed as exc:  # the submit's answer, its fields under task.
            errors = {f"task.{path}": texts for path, texts in exc.extra.pop("errors").items()}
            raise ValidationFailed(errors, "" if exc.detail.startswith("invalid field") else exc.detail,
                                   **exc.extra) from None
    return data


@bp.post("/schedules")
def create() -> Response:
    """Create a schedule: 201 with its document; 422 for a bad cron, time zone or task; 429 at the cap."""
    rt = runtime()
    member = rt.members.current()
    schedule = _service().create(member, _load(_create_schema, _json_body()), now_ms())
    return json_response(schedule_document(schedule), 201, {"Location": schedule_path(schedule.id)})


@bp.get("/schedules")
def listing() -> Response:
    """The caller's schedules, newest first, a page at a time."""
    member = runtime().members.current()
    query = page_query(_query_schema)
    try:
        page = _service().page(member, limit=query["limit"], cursor=query["cursor"])
    except ValueError:
        raise ValidationFailed({"cursor": [NOT_A_CURSOR]}) from None
    return json_response({"schedules": [schedule_document(s) for s in page.schedules],
                          "next_cursor": page.next_cursor})


@bp.get("/schedules/<schedule_id>")
def read(schedule_id: str) -> Response:
    """The schedule's document."""
    return json_response(schedule_document(_service().find(runtime().members.current(), schedule_id)))


@bp.patch("/schedules/<schedule_id>")
def change(schedule_id: str) -> Response:
    """Change ``paused``, ``cron``, ``timezone`` or ``task``: 200 with the document."""
    member = runtime().members.current()
    service = _service()
    service.find(member, schedule_id)  # 404 before a body is judged: nothing about others' ids leaks
    schedule = service.update(member, schedule_id, _load(_update_schema, _json_body()), now_ms())
    return json_response(schedule_document(schedule))


@bp.delete("/schedules/<schedule_id>")
def delete(schedule_id: str) -> Response:
    """Delete the schedule: 204 (tasks it created stay)."""
    _service().delete(runtime().members.current(), schedule_id)
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response
