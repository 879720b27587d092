"""Liveness and readiness, outside /api/v1."""

from __future__ import annotations

import redis
from flask import Blueprint, Response

from app.web.api import json_response
from app.web.errors import Unavailable
from app.web.runtime import runtime

bp = Blueprint("health", __name__)
RETRY_AFTER = "30"  # seconds: what it takes to start a worker or a scheduler


@bp.get("/healthz")
def healthz() -> Response:
    """The process is up."""
    return json_response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """200 when Redis answers, every queue has a worker and housekeeping ran within two intervals;
    503 with the same report (``status: degraded`` and its ``problems``) otherwise."""
    try:
        readiness = runtime().readiness()
    except redis.RedisError:
        raise Unavailable("the task store is unreachable") from None
    if readiness.ready:
        return json_response(readiness.document())
    return json_response(readiness.document(), 503, {"Retry-After": RETRY_AFTER})

