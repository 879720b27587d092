"""The OpenAPI document's part for /api/v1/batches (app.web.api.batches), built with docs' own helpers
(app.web.api.docs.build_spec calls :func:`batch_paths`)."""

from __future__ import annotations

import copy
from typing import Any

from apispec import APISpec

from app.core.urls import batch_path
from app.web import batch_schemas as bs
from app.web.api.batches import NOT_FOR_THEN
from app.web.api.docs_components import (
    JSON,
    _content,
    _header,
    _op,
    event_stream,
    nullable,
    ref,
    sse_event,
    typed_body,
)
from app.web.errors import PROBLEM_JSON

BATCH_ID: Any = "BatchId"
THEN_REQUEST = "ThenRequest"  # a submit body whose after, run_at and delay are null or absent
NAMED = (("Batch", bs.BatchDocumentSchema), ("BatchAccepted", bs.BatchAcceptedSchema),
         ("BatchRequest", bs.BatchSchema), ("BatchTasksPage", bs.BatchTasksPageSchema))
_BATCH_ID_FROM_BODY = {"batch_id": "$response.body#/batch_id"}
LINKS: dict[str, Any] = {name: {"operationId": op, "parameters": _BATCH_ID_FROM_BODY} for name, op in (
    ("status", "getBatch"), ("tasks", "listBatchTasks"), ("events", "getBatchEvents"), ("cancel", "cancelBatch"))}
# a batch has at least one task; its then task is null without one (an unresolved link is not followed)
LINKS |= {name: {"operationId": "getTask", "parameters": {"task_id": f"$response.body#/{pointer}"}}
          for name, pointer in (("first_task", "tasks/0/task_id"), ("then_task", "then_task_id"))}
CANCELLED_LINKS = {name: {"operationId": op, "parameters": {"batch_id": "$request.path.batch_id"}} for name, op in (
    ("status", "getBatch"), ("tasks", "listBatchTasks"))}


def _request_components(spec: APISpec) -> None:
    """The batch body as the view loads it: each task a submit body (``BatchTask``), ``then`` one without a time
    of its own (``ThenTask``: its after, run_at and delay null or absent), ``callback`` a URL only (``BatchCallback``:
    a batch's fires once, when it is DONE, so it takes no events). BatchSchema itself keeps them raw (the view
    checks each as a submit, naming the field by its place)."""
    c = spec.components
    c.schema("BatchTask", typed_body(spec, "BatchTask", "SubmitRequest"))
    untimed = copy.deepcopy(c.schemas["SubmitRequest"])  # one base, not a merge a generator cannot type
    untimed["properties"].update({name: {"nullable": True, "enum": [None], "description": "not for a then task"}
                                  for name in NOT_FOR_THEN})
    c.schema(THEN_REQUEST, untimed)
    c.schema("ThenTask", typed_body(spec, "ThenTask", THEN_REQUEST))
    callback = dict(c.schemas["Callback"], properties={"url": c.schemas["Callback"]["properties"]["url"]})
    c.schema("BatchCallback", callback)
    properties = c.schemas["BatchRequest"]["properties"]
    properties["tasks"]["items"] = ref("BatchTask")
    properties["then"] = nullable("ThenTask", properties["then"]["description"])
    properties["callback"] = nullable("BatchCallback", properties["callback"]["description"])


def batch_paths(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    for name, schema in NAMED:
        spec.components.schema(name, schema=schema)
    _request_components(spec)
    spec.components.parameter("BatchId", "path", {
        "name": "batch_id", "schema": {"type": "string", "format": "uuid"},
        "description": "a batch id; any other string, or another member's batch, answers 404"})
    missing = _content(PROBLEM_JSON, "404: batch not found (unknown, someone else's or expired)", "Problem")
    example = {"tasks": [{"type": "demo.sleep", "payload": {"seconds": 1}},
                         {"type": "demo.sleep", "payload": {"seconds": 2}}],
               "then": {"type": "batch.summary", "payload": {}}}
    submit = _op("Submit up to 1,000 tasks as one batch, all or nothing, with an optional `then` task", {
        202: {**_content(JSON, "accepted: the batch document and its tasks in order", "BatchAccepted"),
              "headers": {"Location": {"description": "path of the batch", "schema": {"type": "string"}}},
              "links": LINKS},
        400: "BadRequest", 403: _content(PROBLEM_JSON, "a task's `priority: high` from a key not granted it; or a "
                                         "read token (`insufficient_scope`)", "Problem"),
        413: "PayloadTooLarge", 415: "UnsupportedMediaType",
        422: _content(PROBLEM_JSON, "a task (or `then`, or `callback`) failed validation, each field named by its "
                                    "task's index (`tasks.3.payload...`): nothing was stored", "Problem"),
    }, security, requestBody={"required": True, "description": "at most TASKPORT_MAX_BODY bytes (413 past it)",
                                   "content": {JSON: {"schema": "BatchRequest", "example": example}}},
        operationId="submitBatch")
    spec.path(batch_path(""), operations={"post": submit})
    read = _op("A batch's document: its counts, progress and items, kept as its tasks change (one read)", {
        200: _content(JSON, "the batch document", "Batch"), 404: missing}, security, operationId="getBatch")
    cancel = _op("Cancel the batch's unfinished tasks and its then task (the batch stays readable)", {
        204: {"description": "cancelled", "links": CANCELLED_LINKS}, 404: missing}, security, operationId="cancelBatch")
    spec.path(batch_path("{batch_id}"), parameters=[BATCH_ID], operations={"get": read, "delete": cancel})
    tasks = _op("The batch's tasks in submit order, filtered by status, a page at a time", {
        200: _content(JSON, "a page of status documents", "BatchTasksPage"), 404: missing, 422: "ValidationFailed",
    }, security, parameters=[{"in": "query", "schema": bs.BatchTasksQuerySchema}], operationId="listBatchTasks")
    spec.path(batch_path("{batch_id}", "/tasks"), parameters=[BATCH_ID], operations={"get": tasks})
    events = _op("Live batch documents (Server-Sent Events)", {
        200: {"description": "`event: batch`, `id: <seq>`, `data: <batch document>` per change (coalesced), starting "
                             "with the current document; `: keep-alive` comments; ends after the DONE document",
              "content": event_stream(sse_event("batch", "Batch", "batch"))},
        404: missing, 422: "ValidationFailed",
        429: _content(PROBLEM_JSON, "the member holds TASKPORT_MAX_STREAMS_PER_MEMBER open streams", "Problem", True),
    }, security, operationId="getBatchEvents",
        parameters=[_header("Last-Event-ID", "resume: only states after this id are sent", pattern="^([0-9]{1,18})?$")])
    spec.path(batch_path("{batch_id}", "/events"), parameters=[BATCH_ID], operations={"get": events})
