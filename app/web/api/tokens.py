"""POST /api/v1/tasks/{id}/tokens and /api/v1/batches/{id}/tokens: a read token for a page (app.web.tokens).

Called with the member's API key (a read token may not mint: its scope stops it, app.web.auth); the token reads
that task, or that batch and its tasks, until its ``ttl`` passes. A submit's ``"read_token": true`` (task or
batch) puts the same object in its 202 (:func:`read_token`).
"""

from __future__ import annotations

from flask import Blueprint, Response
from marshmallow import ValidationError

from app.core import processors
from app.core.clock import now_ms
from app.core.states import TaskStatus
from app.core.urls import API_PREFIX, status_document
from app.web.api import json_response
from app.web.api.batches import _service
from app.web.api.tasks import optional_object
from app.web.errors import ValidationFailed
from app.web.runtime import runtime
from app.web.schemas import TokenRequestSchema
from app.web.tokens import BATCH, DEFAULT_TTL, TASK

bp = Blueprint("tokens", __name__, url_prefix=API_PREFIX)
_request_schema = TokenRequestSchema()


@bp.post("/tasks/<task_id>/tokens")
def task_token(task_id: str) -> Response:
    """201 ``{"token", "expires_at"}`` reading the task; 404 as a status read, 410 once it has expired."""
    rt = runtime()
    ttl = _ttl()
    task = rt.service.find(rt.members.current(), task_id)
    now = now_ms()
    doc = status_document(task, now)
    if doc["status"] == TaskStatus.EXPIRED:
        return json_response(doc, 410)
    return json_response(read_token(TASK, task.id, ttl, now), 201)


@bp.post("/batches/<batch_id>/tokens")
def batch_token(batch_id: str) -> Response:
    """201 ``{"token", "expires_at"}`` reading the batch, its pages, its events and its tasks' documents."""
    rt = runtime()
    ttl = _ttl()
    batch = _service().find(rt.members.current(), batch_id)
    return json_response(read_token(BATCH, batch.id, ttl, now_ms()), 201)


def read_token(kind: str, scope_id: str, ttl: int = DEFAULT_TTL, now: int | None = None) -> dict[str, str]:
    """A token for ``kind`` ``scope_id`` minted by this request's API key (a submit's ``read_token`` too)."""
    members = runtime().members
    return members.tokens.mint(kind, scope_id, members.minting_key(), ttl, now_ms() if now is None else now)


def _ttl() -> int:
    """The body's ``ttl`` (none, or ``{}``: the default); 422 naming the member at fault."""
    body = optional_object(runtime().config.max_body, "send no body, or {\"ttl\": seconds} as application/json")
    if body is None:
        return DEFAULT_TTL
    try:
        return int(_request_schema.load(body)["ttl"])
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages)) from None
