"""Liveness and readiness, outside /api/v1, and the submit warning when no worker would run the task."""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, Response

from app.core.logs import task_logger
from app.web.api import json_response
from app.web.errors import Unavailable
from app.web.readiness import STAT_UNSERVED, WARNING_HEADER
from app.web.runtime import runtime

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)
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


def warn_if_unserved(response: Response, priority: str, task_id: str) -> Response:
    """A task accepted (``response``, its 202) while no worker listens on its queue: say so (it stays PENDING
    until one starts). Called by the submit view, which knows the task's queue."""
    rt = runtime()
    try:
        unserved = rt.workers.unserved()
        if not unserved or priority not in unserved:
            return response
        rt.service.store.count(STAT_UNSERVED)
    except redis.RedisError:
        return response  # the task was accepted; the warning is a courtesy
    response.headers[WARNING_HEADER] = f"no-worker; queue={priority}"
    task_logger(log, task_id).warning("submitted while no worker listens on queue %s", priority)
    return response
