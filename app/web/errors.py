"""HTTP errors as types, rendered as RFC 9457 problem details by one renderer (:func:`problem`).

Views raise an :class:`AppError` (or return :func:`render` of one, where a hook must return a response);
the handlers below render it, and every other error, with :func:`problem`: nothing else writes a
problem document.

Nothing internal reaches a body: unexpected exceptions become a generic 500 (logged with traceback),
Redis outages a 503 with Retry-After (unreachable, out of memory, read-only, loading: one log line each,
no traceback), and werkzeug's own errors (413, 405, ...) the same problem shape.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from app.core.connection import NoReplicaError

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


class AppError(Exception):
    status = 500
    slug = "internal"
    title = "Internal server error"

    def __init__(self, detail: str = "", *, headers: dict[str, str] | None = None, title: str | None = None,
                 slug: str | None = None, retry_after: int | None = None, **extra: Any) -> None:
        """``title`` and ``slug`` replace the class's own for this instance; ``retry_after`` (seconds) becomes
        the ``Retry-After`` header, so a raiser outside the views (the service) says when, not how;
        ``extra`` are members of the body."""
        if title is not None:
            self.title = title
        if slug is not None:
            self.slug = slug
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)  # whole seconds, the form every client here reads
        self.extra = extra


class BadRequest(AppError):
    status, slug, title = 400, "bad-request", "Malformed request"


class Unauthorized(AppError):
    status, slug, title = 401, "unauthorized", "Missing or unknown API key"


class Forbidden(AppError):
    status, slug, title = 403, "forbidden", "Forbidden"


class NotFound(AppError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(AppError):
    status, slug, title = 409, "conflict", "Conflict with the task's state"


class Duplicate(AppError):
    """A submit whose dedup key another task holds (its own ``status`` member: ``DUPLICATE``)."""

    status, slug, title = 409, "duplicate", "Duplicate task"


class UnsupportedMediaType(AppError):
    status, slug, title = 415, "unsupported-media-type", "Unsupported media type"


class ValidationFailed(AppError):
    status, slug, title = 422, "validation", "Request failed validation"

    def __init__(self, errors: dict[str, list[str]], detail: str = "", **extra: Any) -> None:
        first = next(iter(errors), "")
        super().__init__(detail or f"invalid field: {first}", errors=errors, **extra)


class BodyStalled(AppError):
    """The client stopped sending its request body (app.web.webworker.ClientBody): a client's fault, not a 5xx."""

    status, slug, title = 408, "request-timeout", "Request timeout"

    def __init__(self, seconds: float | None) -> None:
        wait = f"{seconds:g} s" if seconds else "too long"
        super().__init__(f"the request body stopped arriving: no byte for {wait} before its end; send it whole")


class TooManyRequests(AppError):
    status, slug, title = 429, "too-many-requests", "Too many requests"


class Unavailable(AppError):
    status, slug, title = 503, "unavailable", "Service temporarily unavailable"

    def __init__(self, detail: str = "", **extra: Any) -> None:
        super().__init__(detail, retry_after=5, **extra)  # seconds: a Redis restart's order


# Redis answers that mean "not now" rather than "not this": unreachable or timed out, full (maxmemory
# with noeviction), a replica since a failover, still loading its data, busy in a long script. A write
# inside a Lua script gets them wrapped ("Error running script ...: -OOM command not allowed ..."), so
# the reply's text is read as well as redis-py's exception class.
UNAVAILABLE_DETAILS = {
    "unreachable": "the task store is unreachable, retry shortly",
    "OOM": "the task store is out of memory, retry later",
    "READONLY": "the task store is read-only (a failover may be in progress), retry shortly",
    "LOADING": "the task store is loading its data, retry shortly",
    "MASTERDOWN": "the task store has lost its primary, retry shortly",
    "NOREPLICAS": "the task store has no replica to confirm the write, retry shortly",
    "BUSY": "the task store is busy, retry shortly",
}
_UNAVAILABLE_CLASSES: tuple[tuple[type[redis.exceptions.RedisError], str], ...] = (
    (redis.exceptions.BusyLoadingError, "LOADING"),  # ConnectionError subclasses: before it
    (NoReplicaError, "NOREPLICAS"),
    (redis.exceptions.ConnectionError, "unreachable"),
    (redis.exceptions.TimeoutError, "unreachable"),
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
)


def redis_unavailable(exc: redis.exceptions.RedisError) -> str | None:
    """Which of :data:`UNAVAILABLE_DETAILS` the error is, or None for any other Redis error (a bug)."""
    for cls, reason in _UNAVAILABLE_CLASSES:
        if isinstance(exc, cls):
            return reason
    text = str(exc)
    for code in UNAVAILABLE_DETAILS:
        if text.startswith(f"{code} ") or f"-{code} " in text:
            return code
    return None


def task_not_found() -> NotFound:
    return NotFound("task not found or expired")


def problem(status: int, slug: str, title: str, detail: str, headers: dict[str, str] | None = None,
            extra: dict[str, Any] | None = None) -> Response:
    """The one problem+json renderer: ``type``, ``title``, ``status``, ``detail``, then ``extra``'s members
    (which may replace ``status`` in the body, as a duplicate's ``DUPLICATE`` does; the HTTP status stays)."""
    body = {"type": f"/problems/{slug}", "title": title, "status": status, "detail": detail, **(extra or {})}
    response = Response(orjson.dumps(body), status=status, content_type=PROBLEM_JSON)
    response.headers.update(headers or {})
    return response


def render(exc: AppError) -> Response:
    """``exc`` as its problem+json response (for hooks that return a response rather than raise)."""
    return problem(exc.status, exc.slug, exc.title, exc.detail, exc.headers, exc.extra)


def init_app(app: Flask) -> None:
    """Attach the handlers that turn every error into problem+json."""

    @app.errorhandler(AppError)
    def _app_error(exc: AppError) -> Response:
        return render(exc)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        slug = (exc.name or "error").lower().replace(" ", "-")
        detail = exc.description or exc.name
        if status == 413:
            detail = f"request body is larger than {app.config['MAX_CONTENT_LENGTH']} bytes"
        response = problem(status, slug, exc.name or "Error", detail)
        if status == 405 and exc.valid_methods:  # type: ignore[attr-defined]
            response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
        return response

    @app.errorhandler(redis.exceptions.RedisError)
    def _redis_error(exc: redis.exceptions.RedisError) -> Response:
        reason = redis_unavailable(exc)
        if reason is None:
            return _unexpected(exc)
        # a known condition: one line, no traceback
        log.error("redis unavailable (%s) during %s %s: %s", reason, request.method, request.path, exc)
        return _app_error(Unavailable(UNAVAILABLE_DETAILS[reason]))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error during %s %s", request.method, request.path)
        return problem(500, AppError.slug, AppError.title, "an internal error occurred")
