"""Who is calling: API key -> member. With no keys configured, everyone is the member ``public``."""

from __future__ import annotations

import hmac
import logging

from flask import Flask, g, request

from app.core.config import Config
from app.core.states import HIGH_QUEUE
from app.web.errors import AppError, BadRequest, Unauthorized

OPEN_MEMBER = "public"
PASSED_HOSTS_KEPT = 64  # distinct allowed Host headers remembered per app (see init_app)
log = logging.getLogger(__name__)


class Forbidden(AppError):
    status, slug, title = 403, "forbidden", "Not allowed for this API key"


class Members:
    def __init__(self, config: Config) -> None:
        self.grants = config.grants
        self.keys = config.members
        if not self.keys:
            log.warning("no TASKPORT_API_KEYS configured: open development mode, every caller is %r", OPEN_MEMBER)

    def current(self) -> str:
        """The calling member, from ``Authorization: Bearer <key>``; 401 for a missing or unknown key."""
        return self._caller()[0]

    def check_priority(self, priority: str | None) -> None:
        """403 naming ``priority`` when the calling key may not submit ``priority: high``.

        Only keys listed as ``key:member:high`` may; in open mode the one trusted user (``public``) may."""
        if priority == HIGH_QUEUE and not self._caller()[1]:
            raise Forbidden("this API key may not submit priority high (TASKPORT_API_KEYS key:member:high)",
                            errors={"priority": ["This API key may not submit priority high."]})

    def _caller(self) -> tuple[str, bool]:
        if not self.grants:
            return OPEN_MEMBER, True
        cached: tuple[str, bool] | None = g.get("taskport_caller")
        if cached is not None:
            return cached
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            for key, grant in self.grants.items():
                if hmac.compare_digest(key.encode(), token.strip().encode()):
                    g.taskport_caller = grant
                    return grant
        raise Unauthorized("send Authorization: Bearer <api key>", headers={"WWW-Authenticate": "Bearer"})


def init_app(app: Flask, config: Config) -> None:
    """In open mode (no API keys) answer only requests addressed to one of our own host names.

    A page on another site can make a browser resolve its own name to 127.0.0.1 (DNS rebinding) and then
    call the service as if it were same-origin; the Host header still carries the other site's name.
    With API keys the key is the protection, so any Host is fine (proxies and platforms rewrite it).
    """
    if config.members:
        return
    allowed = config.open_hosts
    # Host headers already let through (the answer depends on the header alone): a set lookup per
    # request instead of werkzeug's host parsing; bounded, since a client chooses the header
    passed: set[str] = set()

    @app.before_request
    def _check_host() -> None:
        raw = request.environ.get("HTTP_HOST")
        if raw in passed:
            return
        name = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
        if name.lower() in allowed:
            if raw is not None and len(passed) < PASSED_HOSTS_KEPT:
                passed.add(raw)
            return
        raise BadRequest(
            "this Host is not one the service answers in open mode; add it to TASKPORT_ALLOWED_HOSTS",
            errors={"Host": [f"Not one of: {', '.join(sorted(allowed))}."]})
