"""HTTP errors as types, rendered as RFC 9457 problem details by one set of handlers.

Nothing internal reaches a body: unexpected exceptions become a generic 500 (logged with traceback),
Redis outages a 503 with Retry-After, and werkzeug's own errors (413, 405, ...) the same problem shape.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


class AppError(Exception):
    status = 500
    slug = "internal"
    title = "Internal server error"

    def __init__(self, detail: str = "", *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.headers = headers or {}
        self.extra = extra


class BadRequest(AppError):
    status, slug, title = 400, "bad-request", "Malformed request"


class Unauthorized(AppError):
    status, slug, title = 401, "unauthorized", "Missing or unknown API key"


class NotFound(AppError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(AppError):
    status, slug, title = 409, "conflict", "Conflict with the task's state"


class UnsupportedMediaType(AppError):
    status, slug, title = 415, "unsupported-media-type", "Unsupported media type"


class ValidationFailed(AppError):
    status, slug, title = 422, "validation", "Request failed validation"

    def __init__(self, errors: dict[str, list[str]], detail: str = "", **extra: Any) -> None:
        first = next(iter(errors), "")
        super().__init__(detail or f"invalid field: {first}", errors=errors, **extra)


class TooManyRequests(AppError):
    status, slug, title = 429, "too-many-requests", "Too many requests"


class Unavailable(AppError):
    status, slug, title = 503, "unavailable", "Service temporarily unavailable"

    def __init__(self, detail: str = "", **extra: Any) -> None:
        super().__init__(detail, headers={"Retry-After": "5"}, **extra)  # seconds: a Redis restart's order


def task_not_found() -> NotFound:
    return NotFound("task not found or expired")


def problem(status: int, slug: str, title: str, detail: str, headers: dict[str, str] | None = None,
            **extra: Any) -> Response:
    body = {"type": f"/problems/{slug}", "title": title, "status": status, "detail": detail, **extra}
    response = Response(orjson.dumps(body), status=status, content_type=PROBLEM_JSON)
    response.headers.update(headers or {})
    return response


def init_app(app: Flask) -> None:
    """Attach the handlers that turn every error into problem+json."""

    @app.errorhandler(AppError)
    def _app_error(exc: AppError) -> Response:
        return problem(exc.status, exc.slug, exc.title, exc.detail, exc.headers, **exc.extra)

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

    @app.errorhandler(redis.exceptions.ConnectionError)
    @app.errorhandler(redis.exceptions.TimeoutError)
    def _redis_down(exc: Exception) -> Response:
        log.error("redis unavailable during %s %s: %s", request.method, request.path, exc)
        return _app_error(Unavailable("the task store is unreachable, retry shortly"))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error during %s %s", request.method, request.path)
        return problem(500, AppError.slug, AppError.title, "an internal error occurred")
