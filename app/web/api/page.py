"""GET /: a small page to submit a task and watch it progress (static HTML + the JS client, no build step).

The page runs on the JS client served beside it (``/static/taskport.js``, also as the ES module
``/static/taskport.mjs``) and reads the known task types and example payloads from
``/api/v1/openapi.json``. The "queues (operators)" link is left out while the dashboard is off
(``TASKPORT_DASHBOARD_PASSWORD`` unset), since /rq/ then answers 404. Its icon, ``/static/favicon.svg``, is named
by a ``<link rel="icon">``: without one a browser asks for ``/favicon.ico`` and logs the 404 in the console.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from flask import Blueprint, Response

from app.web.runtime import runtime

bp = Blueprint("page", __name__)

# Everything the page loads comes from this origin; it talks only to the API of this origin.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

PAGE = Path(__file__).resolve().parent.parent / "static" / "index.html"
# The operator link sits between these markers in index.html.
OPS_LINK = re.compile(rb"<!--ops-->.*?<!--/ops-->", re.DOTALL)


@functools.cache
def _page(dashboard: bool) -> bytes:
    html = PAGE.read_bytes()
    return html if dashboard else OPS_LINK.sub(b"", html)


@bp.get("/")
def index() -> Response:
    """The page (``app/web/static/index.html``, read once; its scripts and style are beside it under /static/)."""
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    body = _page(bool(runtime().config.dashboard_password))
    return Response(body, content_type="text/html; charset=utf-8", headers=headers)
