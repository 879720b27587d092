"""HTTP views. They parse with a schema, call the service, and render; they make no Redis calls."""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response

JSON = "application/json; charset=utf-8"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON document (problem documents come from app.web.errors, the one problem+json renderer)."""
    response = Response(orjson.dumps(body), status=status, content_type=JSON)
    if headers:
        response.headers.update(headers)
    return response
