"""Liveness and readiness, outside /api/v1."""

from __future__ import annotations

import redis
from flask import Blueprint, Response

from app.api import json_response
from app.errors import Unavailable
from app.runtime import runtime

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """The process is up."""
    return json_response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Redis answers: the process can serve requests."""
    try:
        runtime().redis.ping()
    except redis.RedisError:
        raise Unavailable("the task store is unreachable") from None
    return json_response({"status": "ready"})
