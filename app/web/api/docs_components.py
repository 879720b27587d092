"""The components of the OpenAPI document (app.web.api.docs) and the helpers every part of it builds on.

It owns the named schemas and their names (:class:`_Names`, so user processors' schemas never clash), the shared
responses, headers and parameters (:func:`_components`), the submit bodies typed per registered task type
(:func:`typed_body`, with the curated examples), the rewrites a generator or a deployment needs
(:func:`plain_nullables`, :func:`without_callbacks`), the SSE event schemas, and the operation and response helpers
(:func:`_op`, :func:`_content`, :func:`_header`, :func:`ref`) that docs.py and its siblings (batch_docs,
schedule_docs, token_docs, output_docs) build their paths with.
"""

from __future__ import annotations

import copy
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow.common import resolve_schema_cls
from marshmallow import Schema, missing

from app.core import processors
from app.web import schemas
from app.web.callback_schemas import CallbackSchema
from app.web.errors import PROBLEM_JSON

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
