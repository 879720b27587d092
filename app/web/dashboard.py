"""rq-dashboard at /rq, for operators, behind HTTP Basic credentials from the config.

rq-dashboard 0.9's blueprint is a module-level singleton, so nothing is attached to the blueprint
itself (a second ``create_app`` in one process would raise): the credential check is an *app*-level
``before_request``, and the Redis connection is set on each app.

Connection: rq-dashboard reads ``current_app.redis_conn``, which its own ``setup_rq_connection``
would build from ``RQ_DASHBOARD_REDIS_URL`` (and its per-request hook rebuilds from the URL for every
page, with no socket timeouts). Instead that hook is removed and each dashboard view of this app is
wrapped to use the app's own client (timeouts, health checks, the Sentinels' primary, and whatever
``create_app`` was given, e.g. fakeredis in tests); the URL stays in the config only because the pages
display it (password masked). Nothing connects while the app is created.

Choices: an empty ``TASKPORT_DASHBOARD_PASSWORD`` turns the dashboard off (404 "dashboard disabled",
before any credential check); wrong or missing credentials get 401 with ``WWW-Authenticate: Basic``;
``RQ_DASHBOARD_DISABLE_DELETE`` hides deleting and emptying. Requeueing a taskport job runs its task
again when it is FAILED or CANCELLED, and is otherwise refused with a 409 saying why (app.web.requeue);
any other job is requeued by RQ.

Cross-site requests: a browser sends the operator's saved Basic credentials with any request to this
host, including one an image tag or a form on another site makes. So every route of rq-dashboard that
changes state (those declared with POST: requeue one job, requeue all of a queue -- which 0.9 also
answers to GET --, delete, empty, compact) takes POST only (anything else: 405 problem+json, ``Allow:
POST``), and a POST must come from a page of this very host: its ``Origin`` (or, without one, its
``Referer``) names this host, and ``Sec-Fetch-Site``, when sent, says ``same-origin`` (else 403). The
dashboard's own pages post with jQuery from the same origin, so browsers send a matching ``Origin``;
a script may send ``Origin: http://<host>`` itself. A token would need the dashboard's templates
changed; the origin check needs nothing from them.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
import rq_dashboard
from flask import Flask, Response, current_app, request
from werkzeug.exceptions import MethodNotAllowed

from app.core.config import Config
from app.core.jobs import register_queues
from app.web import requeue
from app.web.errors import Forbidden, NotFound, Unauthorized, render

PREFIX = "/rq"
BLUEPRINT = "rq_dashboard"
REALM = 'Basic realm="taskport operators", charset="UTF-8"'


def init_app(app: Flask, config: Config, conn: redis.Redis) -> None:
    """Mount rq-dashboard under /rq, using ``conn``, guarded by the operator credentials of ``config``."""
    app.config["RQ_DASHBOARD_REDIS_URL"] = (displayed_url(config),)
    app.config["RQ_DASHBOARD_DISABLE_DELETE"] = True
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=PREFIX)
    # its per-request hook would parse the URL into a new client on every page (and cannot parse an IPv6
    # Sentinel's): the wrapped views below set the app's own connection instead
    hooks = app.before_request_funcs.get(BLUEPRINT, [])
    hooks[:] = [hook for hook in hooks if hook is not rq_dashboard.web.push_rq_connection]
    app.redis_conn = conn  # type: ignore[attr-defined]  # what setup_rq_connection would set, minus the connect
    requeue.wrap(app, BLUEPRINT)  # a taskport job's Requeue runs its task again, or says why not
    for endpoint, view in list(app.view_functions.items()):
        if endpoint.startswith(f"{BLUEPRINT}."):
            app.view_functions[endpoint] = _with_connection(view, conn)
    app.before_request(functools.partial(_guard, config.dashboard_user, config.dashboard_password,
                                         mutating_endpoints(app)))


def displayed_url(config: Config) -> str:
    """The Redis the pages name: REDIS_URL, or the Sentinels in rq-dashboard's own redis+sentinel:// form."""
    if config.sentinel_addresses:
        hosts = ",".join(f"{host}:{port}" for host, port in config.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{config.redis_sentinel_master}"
    return config.redis_url or "redis://localhost:6379/0"


def mutating_endpoints(app: Flask) -> frozenset[str]:
    """The dashboard's endpoints that change state: every one rq-dashboard declares with POST."""
    return frozenset(rule.endpoint for rule in app.url_map.iter_rules()
                     if rule.endpoint.startswith(f"{BLUEPRINT}.") and "POST" in (rule.methods or ()))


def _with_connection(view: Callable[..., Any], conn: redis.Redis) -> Callable[..., Any]:
    """``view`` run with ``conn`` as the dashboard's connection (rq-dashboard's hook replaces it per request)."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        current_app.redis_conn = conn  # type: ignore[attr-defined]
        register_queues(conn)  # high, default and low listed even before their first job (workers do it too)
        return view(*args, **kwargs)

    return wrapped


def _is_dashboard() -> bool:
    # The path check also covers /rq itself (answered by a redirect to /rq/ before any blueprint is
    # known) and unknown /rq/... paths, so neither reveals anything without credentials.
    return request.blueprint == BLUEPRINT or request.path == PREFIX or request.path.startswith(f"{PREFIX}/")


def _guard(user: str, password: str, mutating: frozenset[str]) -> Response | None:
    """Let a dashboard request through only with the operator's credentials, and a state change only as
    a POST from a page of this host."""
    if not _is_dashboard():
        return None
    refused = operator_check(user, password, "dashboard")
    if refused is not None or request.endpoint not in mutating:
        return refused
    if request.method != "POST":
        raise MethodNotAllowed(valid_methods=["POST"], description="this dashboard action takes POST only")
    return same_origin_check()


def same_origin_check() -> Response | None:
    """None when the request comes from a page of this host (see the module docstring); else a 403."""
    site = request.headers.get("Sec-Fetch-Site")
    source = request.headers.get("Origin") or request.headers.get("Referer") or ""
    if site is not None and site != "same-origin":
        header, why = "Sec-Fetch-Site", f"the browser says the request comes from a {site} page"
    elif not source:
        header, why = "Origin", "a dashboard action needs an Origin (or Referer) header naming this host"
    elif urlsplit(source).netloc.lower() != request.host.lower():
        header, why = "Origin", "the request comes from a page of another site"
    else:
        return None
    return render(Forbidden(why, slug="cross-site", title="Cross-site request refused", errors={header: [why]}))


def operators_unless_open(config: Config, what: str) -> Response | None:
    """``operator_check`` for an operator view that open mode (no API keys, no operator password: one
    trusted user, loopback unless TASKPORT_ALLOW_OPEN) leaves open; with API keys and no operator
    password it is disabled (404), so nothing answers an anonymous caller of a keyed service."""
    if not config.members and not config.dashboard_password:
        return None
    return operator_check(config.dashboard_user, config.dashboard_password, what)


def operator_check(user: str, password: str, what: str) -> Response | None:
    """None when the request carries the operator's HTTP Basic credentials; else the answer to give:
    404 "<what> disabled" when no operator password is configured, 401 with a Basic challenge."""
    if not password:
        return render(NotFound(f"{what} disabled"))
    auth = request.authorization
    if (
        auth is not None and auth.type == "basic"
        and hmac.compare_digest((auth.username or "").encode(), user.encode())
        and hmac.compare_digest((auth.password or "").encode(), password.encode())
    ):
        return None
    return render(Unauthorized(f"the {what} needs HTTP Basic credentials", title="Operator credentials required",
                               headers={"WWW-Authenticate": REALM}))
