"""HTTP views. They parse with a schema, call the service, and render; they make no Redis calls."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from flask import Response
from werkzeug.datastructures import Headers

R = TypeVar("R", bound=Response)
JSON = "application/json; charset=utf-8"
_new = object.__new__
_STATUS_LINES: dict[int, str] = {}  # "200 OK" per status code, as werkzeug's status setter writes it


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None, *,
                  kind: type[R] = Response) -> R:  # type: ignore[assignment]  # (mypy: a TypeVar default)
    """A JSON document (problem documents come from app.web.errors, the one problem+json renderer).

    The same response as ``Response(orjson.dumps(body), status, content_type=JSON)`` with ``headers`` updated in
    (tests/unit/test_api.py compares every attribute), filled in directly: werkzeug's constructor sets the type
    and length through ``Headers.set`` (a value check and a scan each), works out the status line and checks the
    body's type, ~2 µs of every status read (bench/README.md, "Status read, seventh pass"). ``kind``: a subclass of
    Response to make instead (the submit's 202)."""
    data = orjson.dumps(body)
    response = _new(kind)
    fields = _new(Headers)
    fields._list = [("Content-Type", JSON), ("Content-Length", str(len(data)))]
    if headers:
        for name, value in headers.items():
            fields.set(name, value)  # as Headers.update: checked, and replacing a header of that name
    response.headers = fields
    line = _STATUS_LINES.get(status)
    if line is None:
        response.status = status
        _STATUS_LINES[status] = response.status
    else:
        response._status, response._status_code = line, status
    response.direct_passthrough = False
    response._on_close = []
    response.response = [data]
    return response
