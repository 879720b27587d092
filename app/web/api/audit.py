"""GET /api/v1/audit: the audit trail of task transitions, for operators (HTTP Basic, the dashboard's
credentials ``TASKPORT_DASHBOARD_USER`` / ``TASKPORT_DASHBOARD_PASSWORD``; off without a password).

The rest of the operator API (pausing queues: app.web.api.operator) is registered beside it, by this blueprint.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from app.core import audit
from app.core.ids import is_task_id
from app.core.urls import API_PREFIX
from app.web.api import json_response, operator
from app.web.dashboard import operator_check
from app.web.errors import ValidationFailed
from app.web.runtime import runtime

bp = Blueprint("audit", __name__, url_prefix=API_PREFIX)
# app.web registers this blueprint; it brings the operator API's along (once per app)
bp.record_once(lambda state: state.app.register_blueprint(operator.bp))


@bp.before_request
def _operators_only() -> Response | None:
    config = runtime().config
    return operator_check(config.dashboard_user, config.dashboard_password, "audit trail")


@bp.get("/audit")
def audit_trail() -> Response:
    """Audit entries, newest first, optionally of one task or one member, a page at a time."""
    args = request.args
    task_id, member, cursor = args.get("task_id"), args.get("member"), args.get("cursor")
    if task_id is not None and not is_task_id(task_id):
        raise ValidationFailed({"task_id": ["Not a task id."]})
    if member is not None and not 1 <= len(member) <= 128:
        raise ValidationFailed({"member": ["Length must be between 1 and 128."]})
    if cursor is not None and not audit.CURSOR.fullmatch(cursor):
        raise ValidationFailed({"cursor": ["Not a cursor from a previous page."]})
    raw = args.get("limit", "100")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 1 <= int(raw) <= audit.MAX_LIMIT):
        raise ValidationFailed({"limit": [f"Must be between 1 and {audit.MAX_LIMIT}."]})
    page = runtime().service.audit_trail(task_id=task_id, member=member, limit=int(raw), cursor=cursor)
    return json_response({"entries": page.entries, "next_cursor": page.next_cursor})
