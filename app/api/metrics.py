"""GET /metrics: Prometheus exposition of the app's registry (see :mod:`app.metrics`)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request
from prometheus_client.exposition import choose_encoder

from app.metrics import EXTENSION

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text format (or OpenMetrics when the scraper's ``Accept`` asks for it)."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encoder(current_app.extensions[EXTENSION]), content_type=content_type,
                    headers={"Cache-Control": "no-store"})
