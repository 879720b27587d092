"""The OpenAPI part of a task's live output: GET /tasks/{id}/output and the events stream's ``output`` event
(built by app.web.api.docs, on its helpers)."""

from __future__ import annotations

from typing import Any

from apispec import APISpec

from app.core.output import MAX_PAGE
from app.core.urls import task_path

# An events stream's id: the status sequence number, then ``-<line id>`` once the stream sent output lines.
# Opaque to clients: send the last one back as Last-Event-ID (a plain integer, as before, resumes the status only
# and sends every output line kept).
EVENT_ID_PATTERN = "^[0-9]{1,19}(-[0-9]{1,19})?$"
LINE = {"type": "object", "required": ["id", "at", "text"], "additionalProperties": False, "properties": {
    "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the line's id: increasing, opaque to clients"},
    "at": {"type": "string", "format": "date-time", "description": "when the processor emitted it"},
    "text": {"type": "string", "description": "the line, without its newline (cut to TASKPORT_OUTPUT_MAX_LINE_BYTES)"}}}
PAGE = {"type": "object", "required": ["lines", "next"], "additionalProperties": False, "properties": {
    "lines": {"type": "array", "maxItems": MAX_PAGE, "items": {"$ref": "#/components/schemas/OutputLine"}},
    "next": {"type": "string", "nullable": True, "pattern": "^[0-9]+$",
             "description": "the `after` of the next call (the last line's id, or the `after` sent when nothing is "
                            "new); null once the task has ended and every line was served"}}}


def stream_events(status_event: dict[str, Any]) -> dict[str, Any]:
    """The events a task's stream sends: ``status`` (``status_event``, its id the composite one) or ``output``."""
    status = {**status_event, "properties": {**status_event["properties"], "id": {
        "type": "string", "pattern": EVENT_ID_PATTERN,
        "description": "opaque: resume with it as Last-Event-ID (status and output both)"}}}
    output = {**status, "properties": {**status["properties"], "event": {"type": "string", "enum": ["output"]},
                                       "data": {"type": "string", "contentMediaType": "application/json",
                                                "description": "one OutputLine as one line of JSON"}}}
    return {"oneOf": [status, output]}


def output_paths(spec: APISpec, security: list[dict[str, list[str]]], op: Any, task_id: Any) -> None:
    """The output route; ``op`` is app.web.api.docs_components._op, ``task_id`` its task id parameter."""
    spec.components.schema("OutputLine", LINE)
    spec.components.schema("OutputPage", PAGE)
    query = [
        {"in": "query", "name": "after", "required": False, "description": "the id of the last line read (0: none)",
         "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
        {"in": "query", "name": "limit", "required": False, "description": f"lines at most (1 to {MAX_PAGE})",
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": MAX_PAGE}},
    ]
    get = op("A task's live output lines (ctx.emit), oldest first", {
        200: {"description": "lines after `after`, and the cursor for the next call",
              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OutputPage"}}}},
        404: "NotFound", 410: "Gone", 422: "ValidationFailed",
    }, security, operationId="getOutput", parameters=query)
    spec.path(task_path("{task_id}", "/output"), parameters=[task_id], operations={"get": get})
