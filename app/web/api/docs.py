"""GET /api/v1/openapi.json: the OpenAPI 3 document of every endpoint, built once per app; and /docs,
an interactive page (Swagger UI) built from that same document.

The page comes from ``flask-swagger-ui``, whose wheel ships Swagger UI's own files (the page loads
nothing from a CDN); it is mounted with this blueprint, so every app that serves the document serves
the page too.

Bodies come from the marshmallow schemas of :mod:`app.web.schemas` (through apispec's marshmallow
plugin); every registered task type contributes its payload schema (``Payload.<type>``) and an
example submit, so the document also lists the known types (the page at ``/`` reads them from here).
"""

from __future__ import annotations

import copy
import re
import threading
from typing import Any

import orjson
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.common import resolve_schema_cls
from flask import Blueprint, Flask, Response, current_app
from flask.blueprints import BlueprintSetupState
from flask_swagger_ui import get_swaggerui_blueprint
from marshmallow import Schema, missing

from app.core import processors
from app.core.states import QUEUES
from app.core.urls import API_PREFIX, api_path, file_url, task_path
from app.web import schemas
from app.web.api import JSON as JSON_UTF8
from app.web.api.output_docs import output_paths, stream_events
from app.web.callback_schemas import CallbackSchema
from app.web.errors import PROBLEM_JSON
from app.web.runtime import EXTENSION as RUNTIME

bp = Blueprint("docs", __name__, url_prefix=API_PREFIX)
EXTENSION = "taskport.openapi"
_lock = threading.Lock()
TASK_ID: Any = "TaskId"  # a parameter component's name: apispec turns it into a $ref
JSON = "application/json"  # media type keys name the type; the responses add "; charset=utf-8"

# Curated examples for the built-in types; other types get their schema's defaults.
EXAMPLES: dict[str, dict[str, Any]] = {
    "demo.sleep": {"seconds": 10, "steps": 20, "items": 50, "fail_items": [7, 21], "fail_code": None},
    "orders.split": {
        "order_code": "SO-1001", "account_status": "active",
        "items": [{"item_code": "A-1", "quantity": 2, "warehouse": "main"},
                  {"item_code": "B-7", "quantity": 1, "warehouse": "north"},
                  {"item_code": "C-3", "quantity": 0}],
    },  # fmt: skip
    "orders.export": {"rows": 10000, "format": "csv", "start_date": "2026-01-01", "end_date": "2026-06-30"},
}
DESCRIPTION = """Submit long-running work, then poll its status, stream its progress (SSE), fetch its result
or cancel it. Errors are RFC 9457 problem details (`application/problem+json`). Timestamps are ISO 8601 UTC.
Authentication is `Authorization: Bearer <api key>`; with no keys configured the service runs in open mode.
A read token (`POST /tasks/{id}/tokens`) reads one task, or one batch and its tasks, as `Authorization: Bearer
<token>` or `?access_token=<token>`."""


def sse_event(event: str, document: str, of: str) -> dict[str, Any]:
    """One event of a stream as an SSE parser sees it (comments are not events): ``event`` names it, ``data``
    is the ``document`` component as one line of JSON, ``id`` the sequence number of ``of``."""
    return {"type": "object", "required": ["event", "id", "data"], "properties": {
        "event": {"type": "string", "enum": [event]},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": f"the {of}'s event sequence number"},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "description": f"the {document} as one line of JSON"}}}


SSE_EVENT = sse_event("status", "StatusDocument", "task")


def event_stream(events: dict[str, Any]) -> dict[str, Any]:
    """A ``text/event-stream`` media type whose ``events`` schema is each event's (``itemSchema``, OpenAPI 3.2's
    field for a sequential media type, which schemathesis reads in 3.0 documents too), and with no ``schema``:
    a generated client (openapi-python-client) then leaves the stream to the caller (``response.content``),
    where a ``schema`` made it parse the whole stream as one event and raise."""
    return {"text/event-stream": {"itemSchema": events}}

TASK_SUBMIT, TASK_ACCEPTED = "TaskSubmitRequest", "TaskAccepted"  # POST /tasks' own: with read_token (token_docs)
SCHEDULE_TASK_INPUT = "ScheduleTaskInput"  # a schedule's task as create and update take it, without callbacks
UI_PATH = "/docs"
OPENAPI_PATH = "/openapi.json"


@bp.record_once
def _mount_ui(state: BlueprintSetupState) -> None:
    """Swagger UI at /docs, reading the document below (a blueprint per app: tests build many apps)."""
    state.app.register_blueprint(get_swaggerui_blueprint(
        UI_PATH, api_path(OPENAPI_PATH),
        config={"app_name": "taskport API", "layout": "BaseLayout", "deepLinking": True,
                "persistAuthorization": True,
                "validatorUrl": None},  # no badge fetched from validator.swagger.io: the page stays local
        blueprint_name="api_docs"))


@bp.get(OPENAPI_PATH)
def openapi() -> Response:
    """The OpenAPI document (JSON), rendered on the first request and cached for the app's life."""
    return Response(openapi_bytes(current_app), content_type=JSON_UTF8)


def openapi_bytes(app: Flask) -> bytes:
    """The app's serialized document, built once (under a lock, so concurrent first requests build it once)."""
    cached = app.extensions.get(EXTENSION)
    if cached is None:
        with _lock:
            cached = app.extensions.get(EXTENSION)
            if cached is None:
                rt = app.extensions[RUNTIME]
                spec = build_spec(bool(rt.members.keys), operator=bool(rt.config.dashboard_password),
                                  callbacks=bool(rt.config.callback_keys))
                cached = app.extensions[EXTENSION] = orjson.dumps(spec.to_dict())
    return cached  # type: ignore[no-any-return]


# The schemas added under their own names; nested schemas of these reuse the same components.
NAMED_SCHEMAS: tuple[tuple[str, type[Schema]], ...] = (
    ("Items", schemas.ItemsSchema), ("Error", schemas.ErrorSchema), ("Links", schemas.LinksSchema),
    ("StatusDocument", schemas.StatusDocumentSchema), ("SubmitRequest", schemas.SubmitSchema),
    ("Problem", schemas.ProblemSchema), ("TaskConflict", schemas.TaskConflictSchema),
    ("Duplicate", schemas.DuplicateSchema), ("ResultFile", schemas.ResultFileSchema),
    ("Failure", schemas.FailureSchema), ("Result", schemas.ResultSchema), ("HistoryPage", schemas.HistoryPageSchema),
    ("Callback", CallbackSchema),
)


class _Names:
    """Names of nested schemas: class name minus ``Schema``, qualified by module when the name is taken
    (by another class, or by one of :data:`NAMED_SCHEMAS`), so user processors' schemas never clash."""

    def __init__(self) -> None:
        self.names: dict[type, str] = {}
        self.taken = {name for name, _ in NAMED_SCHEMAS}

    def __call__(self, schema: Any) -> str:
        cls = resolve_schema_cls(schema)
        cls = cls[0] if isinstance(cls, list) else cls
        if cls not in self.names:
            base = cls.__name__.removesuffix("Schema") or cls.__name__
            self.names[cls] = f"{cls.__module__}.{base}" if base in self.taken else base
            self.taken.add(self.names[cls])
        return self.names[cls]


def build_spec(keys_configured: bool, operator: bool = True, callbacks: bool = True) -> APISpec:
    """The whole document: components first (so nested schemas reuse them), then every path.

    ``operator``: whether the operator routes (/rq, /api/v1/audit) are served (an operator password is set);
    without it they answer 404 to everyone and are left out, so the document lists only what is served.
    ``callbacks``: whether any member may ask for callbacks (TASKPORT_CALLBACK_SECRETS is set); without it no
    request schema has ``callback`` (:func:`without_callbacks`)."""
    spec = APISpec(title="taskport", version="1", openapi_version="3.0.3",
                   plugins=[MarshmallowPlugin(schema_name_resolver=_Names())],
                   info={"description": DESCRIPTION})
    _components(spec)
    security: list[dict[str, list[str]]] = [{"bearerAuth": []}] if keys_configured else [{}]
    _task_paths(spec, security)
    from app.web.api.batch_docs import batch_paths  # here: those modules build on this one's helpers
    from app.web.api.schedule_docs import schedule_paths
    from app.web.api.token_docs import token_paths

    schedule_paths(spec, security)
    batch_paths(spec, security)
    token_paths(spec, security)
    _other_paths(spec, operator)
    plain_nullables(spec.components.schemas)
    if not callbacks:
        without_callbacks(spec)
    return spec


# The request schemas that take a ``callback`` (a task's, a batch's, a schedule's task's), and its components.
CALLBACK_INPUTS = ("SubmitRequest", TASK_SUBMIT, "BatchRequest", SCHEDULE_TASK_INPUT, "ThenRequest")
CALLBACK_COMPONENTS = ("BatchCallback",)  # Callback stays: the schedule document's task has it


def without_callbacks(spec: APISpec) -> None:
    """Take ``callback`` out of the request schemas when no member has a signing secret: the server would refuse
    every one (422, "Callbacks are not enabled for you"), so the document must not offer it. Those schemas
    allow no other property, so a body with one is invalid by the document too, and its 422 the documented
    ValidationFailed. The answers keep their ``callback`` (null): the status, batch and schedule documents; so a
    schedule's task as create and update take it becomes a component of its own."""
    schemas = spec.components.schemas
    schemas[SCHEDULE_TASK_INPUT] = copy.deepcopy(schemas["ScheduleTask"])
    for name in [name for name in schemas if name.split(".")[0] == "ScheduleTaskRequest"]:  # and typed_body's variants
        schemas[name] = _repointed(schemas[name], "ScheduleTask", SCHEDULE_TASK_INPUT)
    for name in CALLBACK_INPUTS:
        del schemas[name]["properties"]["callback"]
    for name in CALLBACK_COMPONENTS:
        del schemas[name]


def _repointed(node: Any, old: str, new: str) -> Any:
    """``node`` with every reference to component ``old`` made one to ``new``."""
    if isinstance(node, dict):
        if node.get("$ref") == ref(old)["$ref"]:
            return {**node, "$ref": ref(new)["$ref"]}
        return {key: _repointed(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_repointed(value, old, new) for value in node]
    return node


def _components(spec: APISpec) -> None:
    c = spec.components
    c.security_scheme("bearerAuth", {"type": "http", "scheme": "bearer"})
    c.security_scheme("basicAuth", {"type": "http", "scheme": "basic"})
    for name, schema in NAMED_SCHEMAS:
        c.schema(name, schema=schema)
    # what a callback URL must look like before its host is resolved (app.core.callback_http): http(s), printable ASCII
    c.schemas["Callback"]["properties"]["url"]["pattern"] = "^[Hh][Tt][Tt][Pp][Ss]?://[!-~]+$"
    input_callback(spec, "SubmitRequest")
    _payload_schemas(spec)
    c.header("RetryAfter", {"description": "seconds to wait before asking again", "schema": {"type": "integer"}})
    c.header("Location", {"description": "path of the task", "schema": {"type": "string"}})
    c.parameter("TaskId", "path", {"name": "task_id", "schema": {"type": "string", "format": "uuid"},
                                   "description": "a task id; any other string answers 404"})
    for name, code, text, body in (
        ("BadRequest", 400, "the body is not JSON or not a JSON object", "Problem"),
        ("Unauthorized", 401, "missing or unknown API key; or a read token that does not count (expired, altered, its "
                              "key removed, the secret rotated): `WWW-Authenticate: Bearer error=\"invalid_token\"`",
         "Problem"),
        ("NotFound", 404, "task not found or expired (unknown, someone else's or gone)", "Problem"),
        ("TaskConflict", 409, "the task's state does not allow this", "TaskConflict"),
        ("PayloadTooLarge", 413, "the body is over TASKPORT_MAX_BODY bytes (with or without a Content-Length). "
                                 "The schemas bound items and characters, not bytes: a schema-valid body can be "
                                 "over it (an orders.split payload at its most items, with long codes)", "Problem"),
        ("UnsupportedMediaType", 415, "the body is not application/json", "Problem"),
        ("ValidationFailed", 422, "invalid fields (paths under `errors`)", "Problem"),
        ("InternalError", 500, "an internal error occurred (details only in the log)", "Problem"),
        ("UriTooLong", 414, "the request line is over gunicorn's limit (4094 bytes), answered before the app",
         "Problem"),
        ("HeadersTooLarge", 431, "a header is over gunicorn's limit (8190 bytes), or there are over 100 of them; "
                                 "answered before the app", "Problem"),
    ):
        c.response(name, _content(PROBLEM_JSON, f"{code}: {text}", body))
    c.schema("LimitProblem", _limit_problem(c.schemas["Problem"]))
    c.response("TooManyRequests", _content(
        PROBLEM_JSON, "429: over the member's request rate (TASKPORT_RATE_LIMIT); or for a write over one of its "
        "caps, which `limit`, `cap` and `active` (or `held`) name: unfinished tasks (TASKPORT_MAX_ACTIVE_TASKS), "
        "stored bytes (TASKPORT_MAX_STORED_BYTES), schedules (TASKPORT_MAX_SCHEDULES)", "LimitProblem", retry=True))
    c.response("Unavailable", _content(PROBLEM_JSON, "Redis or result store down: retry", "Problem", retry=True))
    c.response("Gone", _content(JSON, "EXPIRED: the status document (no result)", "StatusDocument"))
    c.response("StillRunning", _content(JSON, "PENDING or PROCESSING: the status document", "StatusDocument", True))


def _limit_problem(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem of a 429 for a member's cap (app.web.service, app.web.schedule_service): the problem's members
    and the cap's (a copy: the problem's own schema admits no other member)."""
    limited = copy.deepcopy(problem)
    limited["properties"] |= {
        "limit": {"type": "string", "description": "the cap that was reached: its setting's name without TASKPORT_, "
                                                   "lower case"},
        "cap": {"type": "integer", "description": "the cap's value"},
        "active": {"type": "integer", "description": "unfinished tasks or schedules the member holds"},
        "held": {"type": "integer", "description": "bytes the member's tasks hold in Redis"}}
    return limited


def _content(media: str, description: str, schema: Any, retry: bool = False) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {media: {"schema": schema}}}
    if retry:
        response["headers"] = {"Retry-After": "RetryAfter"}
    return response


def ref(component: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{component}"}


def nullable(component: str, description: str) -> dict[str, Any]:
    """An optional object property as an input takes it: the component's object, or null. (apispec renders a
    nullable Nested as "any object, or the component", which would make ``{}`` valid.)"""
    return {"nullable": True, "allOf": [ref(component)], "default": None, "description": description}


NULL_OBJECT = {"type": "object", "nullable": True}


def plain_nullables(node: Any) -> None:
    """Every nullable Nested as :func:`nullable` writes it: apispec renders one (OpenAPI 3.0) as ``anyOf`` of "any
    object, or null" and the component, which code generators type as an untyped dict (openapi-python-client:
    ``doc.items.total`` raises AttributeError)."""
    if isinstance(node, dict):
        variants = node.get("anyOf")
        if isinstance(variants, list) and len(variants) == 2 and NULL_OBJECT in variants:
            node.pop("anyOf")
            node.update(nullable=True, allOf=[v for v in variants if v != NULL_OBJECT])
        for value in node.values():
            plain_nullables(value)
    elif isinstance(node, list):
        for value in node:
            plain_nullables(value)


def input_callback(spec: APISpec, schema: str, component: str = "Callback") -> None:
    """The ``callback`` of input ``schema`` as it is loaded (app.web.callback_schemas), or null: the marshmallow
    field is a plain Dict, since the fast envelope path (app.web.fastload) mirrors no Nested field."""
    properties = spec.components.schemas[schema]["properties"]
    properties["callback"] = nullable(component, properties["callback"]["description"])


def _payload_schemas(spec: APISpec) -> None:
    """``Payload.<type>`` per registered type (a schema shared by two types is added once and referenced)."""
    added: dict[type, str] = {}
    for task_type in processors.known_types():
        proc = processors.get(task_type)
        assert proc is not None
        name = f"Payload.{task_type}"
        cls = type(proc.schema)
        if cls in added:
            spec.components.schema(name, {"allOf": [{"$ref": f"#/components/schemas/{added[cls]}"}]})
        else:
            spec.components.schema(name, schema=proc.schema)
            added[cls] = name


def example_payload(task_type: str, schema: Schema) -> dict[str, Any]:
    """A payload to start from: the curated example, else every field that has a default."""
    if task_type in EXAMPLES:
        return EXAMPLES[task_type]
    example: dict[str, Any] = {}
    for name, field in schema.fields.items():
        default = field.load_default
        if default is not missing:
            example[field.data_key or name] = default() if callable(default) else default
    return example


def typed_body(spec: APISpec, name: str, base: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """A submit body's schema: one variant per registered type (``base`` and ``extra`` with that type's payload
    schema; the payload required when the schema has required fields), so a schema-valid body is one its
    processor takes. POST /tasks, a batch's tasks and its then task and a schedule's task are built from it.

    Each variant is a component of its own, ``<name>.<type>``, and the union a ``oneOf`` of their references: a
    code generator makes one class per variant (openapi-python-client refuses a component whose union members
    are inline ``allOf`` objects, and with it every route that uses the component)."""
    variants = []
    for task_type in processors.known_types():
        proc = processors.get(task_type)
        assert proc is not None
        variant: dict[str, Any] = {"type": "object", "properties": {
            "type": {"type": "string", "enum": [task_type]}, "payload": ref(f"Payload.{task_type}")}}
        if any(field.required for field in proc.schema.fields.values()):
            variant["required"] = ["type", "payload"]  # a payload with required fields must be sent
        spec.components.schema(f"{name}.{task_type}", {"allOf": [ref(base), variant, *extra]})
        variants.append(ref(f"{name}.{task_type}"))
    return {"oneOf": variants} if variants else ref(base)


def _submit_body(spec: APISpec) -> dict[str, Any]:
    examples = {}
    for task_type in processors.known_types():
        proc = processors.get(task_type)
        assert proc is not None
        examples[task_type] = {"summary": task_type,
                               "value": {"type": task_type, "payload": example_payload(task_type, proc.schema)}}
    return {"required": True, "description": "at most TASKPORT_MAX_BODY bytes (413 past it)",
            "content": {JSON: {"schema": typed_body(spec, TASK_SUBMIT, TASK_SUBMIT), "examples": examples}}}


def _op(summary: str, responses: dict[str | int, Any], security: list[dict[str, list[str]]] | None = None,
        **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {str(k): v for k, v in responses.items()}, **extra}
    if security is not None:
        op["security"] = security
        op["responses"].setdefault("401", "Unauthorized")
        op["responses"].setdefault("403", "InsufficientScope")  # a read token outside its scope (token_docs)
        op["responses"].setdefault("429", "TooManyRequests")
        op["responses"].setdefault("503", "Unavailable")
        op["responses"].setdefault("500", "InternalError")
    op["responses"].setdefault("414", "UriTooLong")
    op["responses"].setdefault("431", "HeadersTooLarge")
    return op


def _header(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return {"in": "header", "name": name, "required": False, "schema": {"type": "string", **schema},
            "description": description}


# Links of the stateful contract, each one that holds for every answer it leaves from: from a submit's (or a run
# again's) 202 to everything about that task; from a cancel to the task, which stays readable and may run again;
# from a result to its file only where it has one (no link leads to /result/file from a task whose result has
# none: its 404 there is the contract). The document declares every link, so nothing needs inferring
# (tests/fuzz/schemathesis.toml).
_TASK_ID_FROM_BODY = {"task_id": "$response.body#/task_id"}
SUBMIT_LINKS = {name: {"operationId": op, "parameters": _TASK_ID_FROM_BODY} for name, op in (
    ("status", "getTask"), ("result", "getResult"), ("events", "getEvents"), ("cancel", "cancelTask"),
    ("output", "getOutput"))}
CANCELLED_LINKS = {name: {"operationId": op, "parameters": {"task_id": "$request.path.task_id"}} for name, op in (
    ("status", "getTask"), ("result", "getResult"), ("retry", "retryTask"))}
_FILE_PREFIX, _FILE_SUFFIX = file_url("{}").split("{}")
# the task id out of `result.file.url`, present only in a file result; `#regex:` is schemathesis' extractor
# (to any other reader of the document, a pointer to a member that is not there: an unresolved link)
RESULT_LINKS = {"file": {"operationId": "getResultFile", "parameters": {
    "task_id": f"$response.body#/result/file/url#regex:^{re.escape(_FILE_PREFIX)}([^/]+){re.escape(_FILE_SUFFIX)}$"}}}


def _task_paths(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    submit = _op("Submit a task", {
        202: {**_content(JSON, "accepted: the status document (PENDING), with `read_token` when asked", TASK_ACCEPTED,
                         True),
              "headers": {"Location": "Location", "Retry-After": "RetryAfter"}, "links": SUBMIT_LINKS},
        403: _content(PROBLEM_JSON, "`priority: high` from an API key not granted it (key:member:high); or a read "
                                    "token (`insufficient_scope`: a token only reads)", "Problem"),
        409: {**_content(PROBLEM_JSON, "duplicate: the dedup key is held by another task", "Duplicate"),
              "headers": {"Location": "Location", "X-Task-Deduplicated": {"schema": {"type": "string",
                                                                                      "enum": ["true"]}}}},
        400: "BadRequest", 413: "PayloadTooLarge", 415: "UnsupportedMediaType", 422: "ValidationFailed",
        408: _content(PROBLEM_JSON, "the body stopped arriving for TASKPORT_WEB_IO_TIMEOUT: the connection is closed",
                      "Problem"),
    }, security, requestBody=_submit_body(spec), operationId="submitTask",
        parameters=[_header("Idempotency-Key", "same as `dedup_key` (both given and different: 422); reused "
                                               "within the window for another type or payload: 422; a comma (two "
                                               "headers): 400",
                            minLength=1, maxLength=schemas.MAX_DEDUP_KEY, pattern=r"^[^,\s]([^,]*[^,\s])?$")])
    history = _op("The caller's tasks, newest first", {
        200: _content(JSON, "a page of status documents", "HistoryPage"), 422: "ValidationFailed",
    }, security, parameters=[{"in": "query", "schema": schemas.HistoryQuerySchema}], operationId="listTasks")
    spec.path(api_path("/tasks"), operations={"post": submit, "get": history})
    poll_hint = {"description": "while PENDING or PROCESSING", "schema": {"type": "integer"}}
    status = _op("A task's status document", {
        200: {**_content(JSON, "the status document", "StatusDocument"), "headers": {"Retry-After": poll_hint}},
        404: "NotFound", 410: "Gone",
    }, security, operationId="getTask")
    cancel = _op("Cancel a PENDING or PROCESSING task (it stays readable, as CANCELLED)", {
        204: {"description": "cancelled", "links": CANCELLED_LINKS}, 404: "NotFound", 409: "TaskConflict"}, security,
        operationId="cancelTask")
    spec.path(task_path("{task_id}"), parameters=[TASK_ID], operations={"get": status, "delete": cancel})
    _result_paths(spec, security)
    _retry_path(spec, security)
    events = _op("Live status documents (Server-Sent Events)", {
        200: {"description": "`event: status`, `id: <seq>`, `data: <status document>` per change, starting with "
                             "the current document; `: keep-alive` comments; ends after the terminal event. "
                             "`event: output`, `data: <output line>` per line the task emits (docs/streams.md); "
                             "once there are lines, ids are `<seq>-<line id>`: opaque, resume with the last one",
              "content": event_stream(stream_events(SSE_EVENT))},
        404: "NotFound", 410: "Gone", 422: "ValidationFailed",
        429: _content(PROBLEM_JSON, "the member holds TASKPORT_MAX_STREAMS_PER_MEMBER open streams", "Problem", True),
    }, security, operationId="getEvents",
        parameters=[_header("Last-Event-ID", "resume: only states and output lines after this id are sent",
                            pattern="^([0-9]{1,18}(-[0-9]{1,18})?)?$")])
    spec.path(task_path("{task_id}", "/events"), parameters=[TASK_ID], operations={"get": events})
    output_paths(spec, security, _op, TASK_ID)


def _result_paths(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    result = _op("The result of a COMPLETED task", {
        200: {**_content(JSON, "the result document", "Result"), "links": RESULT_LINKS}, 202: "StillRunning",
        404: "NotFound",
        409: "TaskConflict", 410: "Gone", 503: "Unavailable"}, security, operationId="getResult")
    spec.path(task_path("{task_id}", "/result"), parameters=[TASK_ID], operations={"get": result})
    file = _op("Download the file of a COMPLETED task whose result is a file", {
        200: {"description": "the file as an attachment, with its own content type (`result.file.content_type`: "
                             "the export's are text/csv and xlsx); bytes to a generated client",
              "content": {media: {"schema": {"type": "string", "format": "binary"}}
                          for media in ("application/octet-stream", "*/*")}},
        202: "StillRunning", 409: "TaskConflict", 410: "Gone", 503: "Unavailable",
        404: _content(PROBLEM_JSON, "404: the task is not found (unknown, someone else's or gone); or it COMPLETED "
                      "with a result that has no file (only exports have one); or its file is gone from the result "
                      "store", "Problem")}, security, operationId="getResultFile")
    spec.path(task_path("{task_id}", "/result/file"), parameters=[TASK_ID], operations={"get": file})


def _retry_path(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    retry = _op("Run a FAILED or CANCELLED task again under its own id (docs/api.md#run-again)", {
        202: {**_content(JSON, "queued again: the status document (PENDING; `attempts` keeps counting)",
                         "StatusDocument", True), "headers": {"Location": "Location", "Retry-After": "RetryAfter"},
              "links": SUBMIT_LINKS},
        404: "NotFound", 409: "TaskConflict", 410: "Gone", 400: "BadRequest", 413: "PayloadTooLarge",
        415: "UnsupportedMediaType", 422: "ValidationFailed",
    }, security, operationId="retryTask",
        requestBody={"required": False, "description": "none, or `{}`: the task runs again as it was submitted",
                     "content": {JSON: {"schema": schemas.RetrySchema}}})
    spec.path(task_path("{task_id}", "/retry"), parameters=[TASK_ID], operations={"post": retry})


def _other_paths(spec: APISpec, operator: bool) -> None:
    up = {"type": "object", "properties": {"status": {"type": "string"}}}
    spec.path("/healthz", operations={"get": _op("The process is up", {200: _content(JSON, "up", up)})})
    ready = {"type": "object", "properties": {
        "status": {"type": "string", "enum": ["ready", "degraded"]}, "store": {"type": "string"},
        "workers": {"type": "object", "additionalProperties": {"type": "integer"}},
        "housekeeping": {"type": "object"}, "problems": {"type": "array", "items": {"type": "string"}}}}
    spec.path("/readyz", operations={"get": _op("Redis answers, every queue has a worker, housekeeping runs", {
        200: _content(JSON, "ready", ready),
        503: {"description": "degraded (the report, with `problems`), or Redis unreachable (a problem)",
              "content": {JSON: {"schema": ready}, PROBLEM_JSON: {"schema": "Problem"}}}})})
    spec.path(api_path(OPENAPI_PATH), operations={"get": _op("This document", {
        200: _content(JSON, "the OpenAPI document", {"type": "object"})})})
    spec.path(f"{UI_PATH}/", operations={"get": _op("This document as an interactive page (Swagger UI)", {
        200: _content("text/html", "the page; its scripts and styles are served beside it", {"type": "string"})})})
    metrics = _op("Prometheus metrics (operators, unless in open mode: see docs/operations.md#monitoring)", {
        200: _content("text/plain; version=0.0.4", "Prometheus text format", {"type": "string"}),
        401: _content(PROBLEM_JSON, "operator credentials missing or wrong (`WWW-Authenticate: Basic`)", "Problem"),
        404: _content(PROBLEM_JSON, "metrics disabled (API keys and no operator password)", "Problem")})
    metrics["security"] = [{"basicAuth": []}, {}]
    spec.path("/metrics", operations={"get": metrics})
    dashboard = _op("rq-dashboard, for operators", {
        200: _content("text/html", "the dashboard", {"type": "string"}),
        401: _content(PROBLEM_JSON, "operator credentials missing or wrong (`WWW-Authenticate: Basic`)", "Problem"),
        404: _content(PROBLEM_JSON, "dashboard disabled (no operator password configured)", "Problem"),
    })
    dashboard["security"] = [{"basicAuth": []}]
    if operator:
        spec.path("/rq/", operations={"get": dashboard})
        _audit_path(spec)
        _queue_paths(spec)
    spec.path("/", operations={"get": _op("A page to submit a task and watch it progress", {
        200: _content("text/html", "the page", {"type": "string"})})})


def _audit_path(spec: APISpec) -> None:
    page = {"type": "object", "properties": {"entries": {"type": "array", "items": {"type": "object"}},
                                             "next_cursor": {"type": "string", "nullable": True}}}
    trail = _op("The audit trail of task transitions, newest first (operators; see docs/storage.md)", {
        200: _content(JSON, "entries {id, at, task_id, member, type, from, to, error_code, attempt, "
                            "payload_sha256} and the cursor of the next page", page),
        401: _content(PROBLEM_JSON, "operator credentials missing or wrong (`WWW-Authenticate: Basic`)", "Problem"),
        404: _content(PROBLEM_JSON, "audit trail disabled (no operator password configured)", "Problem"),
        422: "ValidationFailed",
    })
    trail["security"] = [{"basicAuth": []}]
    trail["parameters"] = [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}, "description": d}
                           for n, d in (("task_id", "only this task"), ("member", "only this member's tasks"),
                                        ("limit", "1..1000, default 100"), ("cursor", "next_cursor of a page"))]
    spec.path(api_path("/audit"), operations={"get": trail})


def _queue_paths(spec: APISpec) -> None:
    """POST /api/v1/queues/{queue}/pause and /resume (app.web.api.operator), for operators."""
    state = {"type": "object", "properties": {
        "queue": {"type": "string"}, "paused": {"type": "boolean"},
        "paused_queues": {"type": "array", "items": {"type": "string"}}}}
    queue = {"name": "queue", "in": "path", "required": True, "schema": {"type": "string", "enum": list(QUEUES)},
             "description": "a queue's name; any other answers 404"}
    for action, summary in (("pause", "Pause a queue: no worker takes its jobs until it is resumed (operators)"),
                            ("resume", "Resume a paused queue: workers take its jobs again (operators)")):
        operation = _op(summary, {
            200: _content(JSON, "the queue's state (idempotent)", state),
            401: _content(PROBLEM_JSON, "operator credentials missing or wrong (`WWW-Authenticate: Basic`)",
                          "Problem"),
            403: _content(PROBLEM_JSON, "a browser marks the request as coming from another site's page "
                                        "(`Sec-Fetch-Site`, `Origin`)", "Problem"),
            404: _content(PROBLEM_JSON, "no such queue, or the operator API is off (no operator password)", "Problem"),
        }, operationId=f"{action}Queue", parameters=[queue])
        operation["security"] = [{"basicAuth": []}]
        spec.path(api_path(f"/queues/{{queue}}/{action}"), operations={"post": operation})
