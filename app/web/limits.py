"""Per-member request-rate limits on the task API, counted in the service's own Redis.

flask-limiter (with the ``limits`` library) does the counting: a well-tested moving-window/fixed-window
implementation whose Redis storage is atomic across every web process, with the standard rate-limit
headers, which is more than a home-made INCR/EXPIRE would give. Only the task API (submit, status,
result, events, cancel, history) is limited: health checks, metrics, the page and the dashboard are not.
Over the limit the answer is 429 problem+json with ``Retry-After`` (rendered by app.web.errors).

flask-limiter writes its ``Retry-After`` (the seconds to its window's end, truncated: often 0) on *every*
response it counted, over the one the view set: a 202's or a poll's ``Retry-After: 1`` became 0 a third of
the time, the active-task cap's 5 became 4. So it writes into a header of its own here
(:data:`LIMITER_RETRY_AFTER`), which becomes ``Retry-After`` only on the limiter's own 429 and is dropped
from every other answer, whose ``Retry-After`` (or none) is the contract's (docs/api.md).

Its storage is limits' own Redis storage with one change (:class:`HitStatsStorage`): the hit also answers
the window's TTL, and the headers read the count and the TTL from it, where flask-limiter asked Redis for
them again (a GET and a TTL) after the view (bench/README.md, "The rate limiter's cost").
"""

from __future__ import annotations

import logging
import time

import limits
from flask import Flask, Response, g, has_request_context, request
from flask_limiter import HeaderNames, Limiter
from limits.storage import RedisStorage
from redis import Redis

from app.core.config import Config
from app.core.keys import PREFIX
from app.web.auth import Members

LIMITED_BLUEPRINTS = frozenset({"tasks", "events", "schedules", "batches", "tokens", "output"})
LIMITER_RETRY_AFTER = "X-Taskport-Limiter-Retry-After"  # never sent: see the module docstring


# The fixed window's hit (limits' incr_expire script) that also answers its key's TTL.
INCR_TTL = """
local amount = tonumber(ARGV[2])
local count = redis.call('INCRBY', KEYS[1], amount)
if count == amount then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return {count, redis.call('TTL', KEYS[1])}
"""
LIMITS_MAJOR = 5  # HitStatsStorage overrides limits 5's RedisStorage; tests/unit/test_limits_storage.py pins it


class HitStatsStorage(RedisStorage):
    """limits' Redis storage whose hit also answers the window's TTL and keeps both for the request, so that
    flask-limiter's ``X-RateLimit-*`` headers, which read the count and the expiry of the same key after the
    view, take them from the hit instead of a GET and a TTL more (bench/README.md, "The rate limiter's
    cost"). Outside a request (none here) it reads Redis as limits does."""

    STORAGE_SCHEME = ["taskport+redis"]  # limits registers the scheme with the class: storage_uri below

    def initialize_storage(self, _uri: str) -> None:
        super().initialize_storage(_uri)
        self.lua_incr_ttl = self.get_connection().register_script(INCR_TTL.encode())

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        count, ttl = self.lua_incr_ttl([self.prefixed_key(key)], [expiry, amount])
        if has_request_context():
            g.setdefault(_HITS, {})[key] = (int(count), time.time() + max(int(ttl), 0))
        return int(count)

    def get(self, key: str) -> int:
        hit = _hit(key)
        return hit[0] if hit is not None else super().get(key)

    def get_expiry(self, key: str) -> float:
        hit = _hit(key)
        return hit[1] if hit is not None else super().get_expiry(key)


_HITS = "taskport_limit_hits"  # flask.g: key -> (count, expiry) of this request's hits


def _hit(key: str) -> tuple[int, float] | None:
    return g.get(_HITS, {}).get(key) if has_request_context() else None


if int(limits.__version__.split(".")[0]) != LIMITS_MAJOR:
    raise ImportError(f"app.web.limits.HitStatsStorage is written against limits {LIMITS_MAJOR}, "
                      f"not {limits.__version__}")


def _cost() -> int:
    from app.web.api.batches import SUBMIT_ENDPOINT, request_cost  # here: the views import the app's modules

    return request_cost() if request.endpoint == SUBMIT_ENDPOINT else 1


def init_app(app: Flask, config: Config, members: Members, conn: Redis) -> Limiter | None:
    """Attach the limiter when a limit is in force (see ``Config.request_limit``); None otherwise."""
    if not config.request_limit:
        return None
    # flask-limiter logs every refused request at INFO: a burst would flood the log with one line each.
    logging.getLogger("flask-limiter").setLevel(logging.WARNING)

    # Registered before the limiter's own header hook, so it runs after it (Flask runs them in reverse).
    @app.after_request
    def _limiter_retry_after_on_its_429_only(response: Response) -> Response:
        wait = response.headers.pop(LIMITER_RETRY_AFTER, None)
        # the limiter's own 429 is the one without a Retry-After of the app's (app.web.errors renders it)
        if wait is not None and response.status_code == 429 and "Retry-After" not in response.headers:
            # flask-limiter truncates the wait to whole seconds: "0" in the last second of a window
            response.headers["Retry-After"] = str(max(1, int(wait)))
        return response

    limiter = Limiter(
        key_func=members.current,  # a missing or unknown key is a 401 before anything is counted
        app=app,
        default_limits=[config.request_limit],
        default_limits_exempt_when=lambda: request.blueprint not in LIMITED_BLUEPRINTS,
        default_limits_cost=_cost,  # a batch counts one request per task (app.web.api.batches.request_cost)
        storage_uri="taskport+redis://",  # HitStatsStorage: limits' Redis storage, its headers read from the hit
        # the app's own pool: same server, same timeouts, and fakeredis in unit tests
        storage_options={"connection_pool": conn.connection_pool},  # type: ignore[dict-item]
        key_prefix=f"{PREFIX}limit",
        strategy="fixed-window",  # one INCR per request; a moving window costs a sorted set per member
        headers_enabled=True,  # X-RateLimit-*, and its Retry-After under a name of its own (see above)
        header_name_mapping={HeaderNames.RETRY_AFTER: LIMITER_RETRY_AFTER},
    )
    return limiter
