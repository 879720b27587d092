"""CORS for the task API: pages on the origins of ``TASKPORT_CORS_ORIGINS`` may call it from a browser.

flask-cors writes the headers (the Fetch standard's rules, as a well-kept library applies them). Around it:

- **Only the public task API** (:data:`CORS_PATHS`: tasks, their events, results, output and tokens, and
  batches) gets CORS. The operator surfaces (the dashboard ``/rq`` and its POSTs, ``/api/v1/queues``,
  ``/api/v1/audit``, ``/metrics``) and the rest keep their same-origin rule: no CORS header at all.
- **A preflight is answered before any other hook** (:func:`init_app`'s ``_preflight``): a browser sends it
  without credentials, so the rate limiter (which reads the caller) would answer it 401. It is answered 200
  with the methods the route takes, whatever its origin; only an allowed origin's gets the ``Access-Control-*``
  headers, so the browser blocks every other.
- **``Vary: Origin`` on every answer of those routes**, allowed origin or not (flask-cors adds it only when more
  than one origin is configured): a shared cache must not hand one origin's answer to another.
- No credentials mode: tokens travel in the ``Authorization`` header or the query, never in cookies.
- A request without ``Origin`` (curl, a backend) gets no ``Access-Control-*`` header: flask-cors' ``always_send``
  would send them to every request of a configured route.

Unset ``TASKPORT_CORS_ORIGINS``: nothing is installed, and no answer carries a CORS header (as before).
"""

from __future__ import annotations

import logging
import re

from flask import Flask, Response, request
from flask_cors import CORS

from app.core.config import Config
from app.core.urls import API_PREFIX

CORS_PATHS = re.compile(rf"^{re.escape(API_PREFIX)}/(tasks|batches)(/.*)?$")
METHODS = ["GET", "HEAD", "POST", "DELETE"]  # what any of those routes takes; a preflight names the route's own
ALLOW_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"]
EXPOSE_HEADERS = ["Location", "Retry-After", "Link", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                  "X-Task-Deduplicated", "Taskport-Warning", "Content-Disposition"]
MAX_AGE = 600  # seconds a browser may keep a preflight's answer (Chromium caps it at 7200, Firefox at 86400)
PREFLIGHT_METHOD = "HTTP_ACCESS_CONTROL_REQUEST_METHOD"
ALLOW_METHODS = "Access-Control-Allow-Methods"


def init_app(app: Flask, config: Config) -> None:
    """Install CORS for :data:`CORS_PATHS` when TASKPORT_CORS_ORIGINS names origins; else nothing."""
    origins = list(config.cors_allowed)
    if not origins:
        return
    logging.getLogger("flask_cors").setLevel(logging.WARNING)  # it logs every refused preflight at INFO

    @app.before_request
    def _preflight() -> Response | None:
        """A preflight of a route of the task API: answered here, before the hooks that read the caller."""
        if (request.method == "OPTIONS" and PREFLIGHT_METHOD in request.environ and request.url_rule is not None
                and CORS_PATHS.match(request.path)):
            return app.make_default_options_response()
        return None

    # Registered before flask-cors' own hook, so it runs after it (Flask runs them in reverse).
    @app.after_request
    def _vary_and_route_methods(response: Response) -> Response:
        if not CORS_PATHS.match(request.path):
            return response
        response.vary.add("Origin")
        if request.method == "OPTIONS" and ALLOW_METHODS in response.headers and "Allow" in response.headers:
            response.headers[ALLOW_METHODS] = response.headers["Allow"]  # the route's own, as its Allow says
        return response

    CORS(app, resources={CORS_PATHS.pattern: {}}, origins=origins, methods=METHODS, allow_headers=ALLOW_HEADERS,
         expose_headers=EXPOSE_HEADERS, max_age=MAX_AGE, supports_credentials=False, vary_header=True,
         send_wildcard=False, automatic_options=False, always_send=False)
