"""The operator API beside /api/v1/audit: pause and resume a queue (``taskport pause QUEUE`` / ``resume QUEUE``).

    POST /api/v1/queues/{queue}/pause    no worker takes a job from the queue until it is resumed; running
                                         ones finish, submits are still accepted (their tasks wait, PENDING)
    POST /api/v1/queues/{queue}/resume   workers take its jobs again (within app.core.jobclaims.WAKE_WAIT s)

Both answer ``{"queue", "paused", "paused_queues"}`` and are idempotent. The pause is a member of
``keys.PAUSED_QUEUES`` in Redis (app.web.readiness.QueuePauses), so it outlives every process; the workers
read it (workers.dequeue.HonoursPauses), /readyz, /metrics and rq-dashboard show it.

Who may: the operator, with the dashboard's HTTP Basic credentials (``TASKPORT_DASHBOARD_USER`` /
``TASKPORT_DASHBOARD_PASSWORD``; off, 404, without a password), as for the audit trail. A browser sends saved
Basic credentials with any request to this host, a form on another site's page included, so a POST that a
browser marks as coming from elsewhere (``Sec-Fetch-Site`` other than same-origin, or an ``Origin`` naming
another host) is refused (403); a client that is no browser (the CLI, curl) sends neither.

Registered by app.web.api.audit's blueprint, beside itself (app.web's list of blueprints names that one).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from flask import Blueprint, Response, request

from app.core.states import QUEUES
from app.core.urls import API_PREFIX
from app.web.api import json_response
from app.web.dashboard import operator_check
from app.web.errors import Forbidden, NotFound, render
from app.web.readiness import QueuePauses
from app.web.runtime import runtime

bp = Blueprint("operator", __name__, url_prefix=API_PREFIX)
log = logging.getLogger(__name__)


@bp.before_request
def _operators_only() -> Response | None:
    config = runtime().config
    refused = operator_check(config.dashboard_user, config.dashboard_password, "operator API")
    return refused if refused is not None else _not_cross_site()


def _not_cross_site() -> Response | None:
    """None unless a browser says the request comes from another site's page (then a 403 naming the header)."""
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if site is not None and site not in ("same-origin", "none"):
        header, why = "Sec-Fetch-Site", f"the browser says the request comes from a {site} page"
    elif origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
        header, why = "Origin", "the request comes from a page of another site"
    else:
        return None
    return render(Forbidden(why, slug="cross-site", title="Cross-site request refused", errors={header: [why]}))


@bp.post("/queues/<queue>/pause")
def pause(queue: str) -> Response:
    """Pause a queue: workers take none of its jobs until it is resumed."""
    pauses = _pauses(queue)
    if pauses.pause(queue):
        log.info("queue %s paused by operator %s: no worker takes its jobs until it is resumed", queue,
                 runtime().config.dashboard_user)
    return _answer(pauses, queue)


@bp.post("/queues/<queue>/resume")
def resume(queue: str) -> Response:
    """Resume a paused queue: workers take its jobs again."""
    pauses = _pauses(queue)
    if pauses.resume(queue):
        log.info("queue %s resumed by operator %s", queue, runtime().config.dashboard_user)
    return _answer(pauses, queue)


def _pauses(queue: str) -> QueuePauses:
    if queue not in QUEUES:
        why = f"no such queue: one of {', '.join(QUEUES)}"
        raise NotFound(why, errors={"queue": [why]})
    return QueuePauses(runtime().redis)


def _answer(pauses: QueuePauses, queue: str) -> Response:
    paused = pauses.paused()
    return json_response({"queue": queue, "paused": queue in paused, "paused_queues": paused},
                         headers={"Cache-Control": "no-store"})
