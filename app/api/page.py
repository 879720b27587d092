"""GET /: a small page to submit a task and watch it progress (static HTML + vanilla JS, no build step).

The page reads the known task types and example payloads from ``/api/v1/openapi.json``. Without an
API key it follows a task with ``EventSource`` on its events link; with a key it polls the status
endpoint instead, because ``EventSource`` cannot send an ``Authorization`` header.
"""

from __future__ import annotations

import functools
from pathlib import Path

from flask import Blueprint, Response

bp = Blueprint("page", __name__)

# Everything the page loads comes from this origin; it talks only to the API of this origin.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


PAGE = Path(__file__).resolve().parent.parent / "static" / "index.html"


@functools.cache
def _page() -> bytes:
    return PAGE.read_bytes()


@bp.get("/")
def index() -> Response:
    """The page (``app/static/index.html``, read once; its script and style are beside it under /static/)."""
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    return Response(_page(), content_type="text/html; charset=utf-8", headers=headers)
