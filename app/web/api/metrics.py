"""GET /metrics: Prometheus exposition of the app's registry (see :mod:`app.web.metrics`).

For operators: with an operator password (``TASKPORT_DASHBOARD_PASSWORD``) it takes the dashboard's
HTTP Basic credentials (Prometheus: ``basic_auth`` in the scrape config); with API keys and no operator
password it is off (404); in open mode (neither) it answers anyone who can reach the port, which is
loopback unless ``TASKPORT_ALLOW_OPEN``. See docs/operations.md#monitoring.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request
from prometheus_client.exposition import choose_encoder

from app.web.dashboard import operators_unless_open
from app.web.metrics import EXTENSION
from app.web.runtime import runtime

bp = Blueprint("metrics", __name__)


@bp.before_request
def _operators_only() -> Response | None:
    return operators_unless_open(runtime().config, "metrics")


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text format (or OpenMetrics when the scraper's ``Accept`` asks for it)."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encoder(current_app.extensions[EXTENSION]), content_type=content_type,
                    headers={"Cache-Control": "no-store"})
