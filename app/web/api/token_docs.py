"""The OpenAPI document's part for read tokens (app.web.api.tokens, app.web.auth), built with docs' own helpers
(app.web.api.docs.build_spec calls :func:`token_paths` once every keyed path is in)."""

from __future__ import annotations

import copy
from typing import Any

from apispec import APISpec

from app.core.urls import batch_path, task_path
from app.web.api.docs_components import JSON, TASK_ACCEPTED, TASK_ID, TASK_SUBMIT, _content, _op, ref
from app.web.errors import PROBLEM_JSON
from app.web.schemas import ReadTokenSchema, TokenRequestSchema

# The reads a read token may make (app.web.auth.TASK_READS, BATCH_READS): each takes the token as a second way in.
READ_OPERATIONS = frozenset({"getTask", "getEvents", "getResult", "getResultFile", "getOutput", "getBatch",
                             "listBatchTasks", "getBatchEvents"})
TOKEN_SECURITY: list[dict[str, list[str]]] = [{"readToken": []}, {"readTokenQuery": []}]
BATCH_ID: Any = "BatchId"  # a parameter component's name (app.web.api.batch_docs): apispec turns it into a $ref


def token_paths(spec: APISpec, security: list[dict[str, list[str]]]) -> None:
    c = spec.components
    c.security_scheme("readToken", {"type": "http", "scheme": "bearer", "description": "a read token (tpr.…): GET "
                                    "of its task, or its batch and the batch's tasks; anything else is 403"})
    c.security_scheme("readTokenQuery", {"type": "apiKey", "in": "query", "name": "access_token",
                                         "description": "a read token where no header can be set (EventSource)"})
    if "ReadToken" not in c.schemas:  # the batch's 202 may have named it already (nested in BatchAccepted)
        c.schema("ReadToken", schema=ReadTokenSchema)
    c.schema("TokenRequest", schema=TokenRequestSchema)
    c.response("InsufficientScope", _content(
        PROBLEM_JSON, "403: a read token outside its scope (a write, or another route): `WWW-Authenticate: Bearer "
                      "error=\"insufficient_scope\"`", "Problem"))
    submit = copy.deepcopy(c.schemas["SubmitRequest"])
    submit["properties"]["read_token"] = {"type": "boolean", "default": False, "description": "true: the 202 "
                                          "carries `read_token`, a token reading this task (docs/api.md, Read tokens)"}
    c.schema(TASK_SUBMIT, submit)
    accepted = copy.deepcopy(c.schemas["StatusDocument"])
    accepted["properties"]["read_token"] = ref("ReadToken")
    c.schema(TASK_ACCEPTED, accepted)
    for path in spec._paths.values():  # apispec has no public reader of the paths added so far
        for operation in path.values():
            if isinstance(operation, dict) and operation.get("operationId") in READ_OPERATIONS:
                operation["security"] = [*operation["security"], *TOKEN_SECURITY]
    body = {"required": False, "description": "none, or `{\"ttl\": seconds}` (1 to 86400, default 3600)",
            "content": {JSON: {"schema": "TokenRequest"}}}
    minted = _content(JSON, "the token and when it expires", "ReadToken")
    common: dict[str | int, Any] = {
        201: minted, 400: "BadRequest", 413: "PayloadTooLarge", 415: "UnsupportedMediaType", 422: "ValidationFailed"}
    task = _op("A read token for this task: its status, events, result, result file and output (GET only)", {
        **common, 404: "NotFound", 410: "Gone"}, security, requestBody=body, operationId="createTaskToken")
    spec.path(task_path("{task_id}", "/tokens"), parameters=[TASK_ID], operations={"post": task})
    batch = _op("A read token for this batch: its document, pages, events, and its tasks' documents (GET only)", {
        **common, 404: _content(PROBLEM_JSON, "404: batch not found (unknown, someone else's or expired)", "Problem")},
        security, requestBody=body, operationId="createBatchToken")
    spec.path(batch_path("{batch_id}", "/tokens"), parameters=[BATCH_ID], operations={"post": batch})
