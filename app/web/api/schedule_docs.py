"""The OpenAPI document's part for /api/v1/schedules (app.web.api.schedules), built with docs' own helpers
(app.web.api.docs.build_spec calls :func:`schedule_paths`)."""

from __future__ import annotations

from typing import Any

from apispec import APISpec

from app.web import schedule_schemas as ss
from app.web.api.docs_components import JSON, _content, _op, input_callback, ref, typed_body
from app.web.errors import PROBLEM_JSON
from app.web.schedule_service import schedule_path

SCHEDULE_ID: Any = "ScheduleId"
NAMED = (("Schedule", ss.ScheduleSchema), ("ScheduleCreate", ss.ScheduleCreateSchema),
         ("ScheduleUpdate", ss.ScheduleUpdateSchema), ("SchedulePage", ss.SchedulePageSchema))


def _body(schema: str, example: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "description": "at most TASKPORT_MAX_BODY bytes (413 past it)",
            "content": {JSON: {"schema": schema, "example": example}}}


_SCHEDULE_ID_FROM_BODY = {"schedule_id": "$response.body#/schedule_id"}
LINKS: dict[str, Any] = {name: {"operationId": op, "parameters": _SCHEDULE_ID_FROM_BODY} for name, op in (
    ("read", "getSchedule"), ("change", "updateSchedule"), ("delete", "deleteSchedule"))}
# null until it first fires (an unresolved link is not followed)
READ_LINKS = {"last_task": {"operationId": "getTask", "parameters": {"task_id": "$response.body#/last_task_id"}}}
# a deleted schedule is gone: reading it again is 404
DELETED_LINKS = {"read": {"operationId": "getSchedule", "parameters": {"schedule_id": "$request.path.schedule_id"}}}


def _request_components(spec: APISpec) -> None:
    """A schedule's task as create and update load it: one variant per type (``ScheduleTaskRequest``, its payload
    checked by that type's schema) and a callback object or null; the document's ``task`` keeps ScheduleTask."""
    c = spec.components
    input_callback(spec, "ScheduleTask")
    c.schema("ScheduleTaskRequest", typed_body(spec, "ScheduleTaskRequest", "ScheduleTask"))
    for name in ("ScheduleCreate", "ScheduleUpdate"):
        c.schemas[name]["properties"]["task"] = ref("ScheduleTaskRequest")


def schedule_paths(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    for name, schema in NAMED:
        spec.components.schema(name, schema=schema)
    _request_components(spec)
    spec.components.parameter("ScheduleId", "path", {
        "name": "schedule_id", "schema": {"type": "string", "format": "uuid"},
        "description": "a schedule id; any other string, or another member's schedule, answers 404"})
    document = _content(JSON, "the schedule document", "Schedule")
    missing = _content(PROBLEM_JSON, "404: schedule not found (unknown or someone else's)", "Problem")
    example = {"cron": "*/15 * * * *", "timezone": "Europe/Paris", "name": "refresh",
               "task": {"type": "demo.sleep", "payload": {"seconds": 5}}}
    create = _op("Create a periodic schedule: each fire time of `cron` (read in `timezone`) submits `task` once", {
        201: {**document, "headers": {"Location": {"description": "path of the schedule",
                                                   "schema": {"type": "string"}}}, "links": LINKS},
        400: "BadRequest", 403: _content(PROBLEM_JSON, "`task.priority: high` from a key not granted it", "Problem"),
        413: "PayloadTooLarge", 415: "UnsupportedMediaType",
        422: "ValidationFailed",  # a bad cron or time zone, an unknown field, a task its processor refuses
        429: _content(PROBLEM_JSON, "the member holds TASKPORT_MAX_SCHEDULES schedules (`limit`: max_schedules), "
                                    "or is over its request rate", "LimitProblem", retry=True),
    }, security, requestBody=_body("ScheduleCreate", example), operationId="createSchedule")
    listing = _op("The caller's schedules, newest first", {
        200: _content(JSON, "a page of schedule documents", "SchedulePage"), 422: "ValidationFailed",
    }, security, parameters=[{"in": "query", "schema": ss.ScheduleQuerySchema}], operationId="listSchedules")
    spec.path(schedule_path(), operations={"post": create, "get": listing})
    read = _op("A schedule's document", {200: {**document, "links": READ_LINKS}, 404: missing}, security,
               operationId="getSchedule")
    change = _op("Change `paused`, `cron`, `timezone` or `task` (a new timing counts from now)", {
        200: {**document, "links": LINKS}, 400: "BadRequest",
        403: _content(PROBLEM_JSON, "`task.priority: high` not granted", "Problem"),
        404: missing, 413: "PayloadTooLarge", 415: "UnsupportedMediaType", 422: "ValidationFailed",
    }, security, requestBody=_body("ScheduleUpdate", {"paused": True}), operationId="updateSchedule")
    delete = _op("Delete a schedule (the tasks it created stay)", {
        204: {"description": "deleted", "links": DELETED_LINKS}, 404: missing},
                 security, operationId="deleteSchedule")
    spec.path(schedule_path("{schedule_id}"), parameters=[SCHEDULE_ID],
              operations={"get": read, "patch": change, "delete": delete})
