"""GET /api/v1/openapi.json: the OpenAPI 3 document of every endpoint, built once per app; and /docs,
an interactive page (Swagger UI) built from that same document.

The page comes from ``flask-swagger-ui``, whose wheel ships Swagger UI's own files (the page loads
nothing from a CDN); it is mounted with this blueprint, so every app that serves the document serves
the page too.

Bodies come from the marshmallow schemas of :mod:`app.web.schemas` (through apispec's marshmallow
plugin); every registered task type contributes its payload schema (``Payload.<type>``) and an
example submit, so the document also lists the known types (the page at ``/`` reads them from here).
The components and the helpers every path is built with are :mod:`app.web.api.docs_components`; the
batch, schedule, token and output paths are their own modules' (``*_docs``).
"""

from __future__ import annotations

import re
import threading

import orjson
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Blueprint, Flask, Response, current_app
from flask.blueprints import BlueprintSetupState
from flask_swagger_ui import get_swaggerui_blueprint

from app.core.states import QUEUES
from app.core.urls import API_PREFIX, api_path, file_url, task_path
from app.web import schemas
from app.web.api import JSON as JSON_UTF8
from app.web.api.batch_docs import batch_paths
from app.web.api.docs_components import (
    JSON,
    SSE_EVENT,
    TASK_ACCEPTED,
    TASK_ID,
    _components,
    _content,
    _header,
    _Names,
    _op,
    _submit_body,
    event_stream,
    plain_nullables,
    without_callbacks,
)
from app.web.api.output_docs import output_paths, stream_events
from app.web.api.schedule_docs import schedule_paths
from app.web.api.token_docs import token_paths
from app.web.errors import PROBLEM_JSON
from app.web.runtime import EXTENSION as RUNTIME

bp = Blueprint("docs", __name__, url_prefix=API_PREFIX)
EXTENSION = "taskport.openapi"
_lock = threading.Lock()

DESCRIPTION = """Submit long-running work, then poll its status, stream its progress (SSE), fetch its result
or cancel it. Errors are RFC 9457 problem details (`application/problem+json`). Timestamps are ISO 8601 UTC.
Authentication is `Authorization: Bearer <api key>`; with no keys configured the service runs in open mode.
A read token (`POST /tasks/{id}/tokens`) reads one task, or one batch and its tasks, as `Authorization: Bearer
<token>` or `?access_token=<token>`."""
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
    schedule_paths(spec, security)
    batch_paths(spec, security)
    token_paths(spec, security)
    _other_paths(spec, operator)
    plain_nullables(spec.components.schemas)
    if not callbacks:
        without_callbacks(spec)
    return spec


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
