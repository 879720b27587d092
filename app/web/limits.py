"""Per-member request-rate limits on the task API, counted in the service's own Redis.

flask-limiter (with the ``limits`` library) does the counting: a well-tested moving-window/fixed-window
implementation whose Redis storage is atomic across every web process, with the standard rate-limit
headers, which is more than a home-made INCR/EXPIRE would give. Only the task API (submit, status,
result, events, cancel, history) is limited: health checks, metrics, the page and the dashboard are not.
Over the limit the answer is 429 problem+json with ``Retry-After`` (rendered by app.web.errors).
"""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from flask_limiter import Limiter
from redis import Redis

from app.core.config import Config
from app.core.keys import PREFIX
from app.web.auth import Members

LIMITED_BLUEPRINTS = frozenset({"tasks", "events", "schedules"})


def init_app(app: Flask, config: Config, members: Members, conn: Redis) -> Limiter | None:
    """Attach the limiter when a limit is in force (see ``Config.request_limit``); None otherwise."""
    if not config.request_limit:
        return None
    # flask-limiter logs every refused request at INFO: a burst would flood the log with one line each.
    logging.getLogger("flask-limiter").setLevel(logging.WARNING)

    # Registered before the limiter's own header hook, so it runs after it (Flask runs them in reverse).
    @app.after_request
    def _retry_after_at_least_one_second(response: Response) -> Response:
        # flask-limiter truncates the wait to whole seconds: "0" in the last second of a window.
        if response.status_code == 429 and response.headers.get("Retry-After") == "0":
            response.headers["Retry-After"] = "1"
        return response

    limiter = Limiter(
        key_func=members.current,  # a missing or unknown key is a 401 before anything is counted
        app=app,
        default_limits=[config.request_limit],
        default_limits_exempt_when=lambda: request.blueprint not in LIMITED_BLUEPRINTS,
        storage_uri="redis://",
        # the app's own pool: same server, same timeouts, and fakeredis in unit tests
        storage_options={"connection_pool": conn.connection_pool},  # type: ignore[dict-item]
        key_prefix=f"{PREFIX}limit",
        strategy="fixed-window",  # one INCR per request; a moving window costs a sorted set per member
        headers_enabled=True,  # X-RateLimit-* and, on 429, Retry-After
    )
    return limiter
