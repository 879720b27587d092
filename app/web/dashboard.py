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
any other job is requeued by RQ. The icon its pages link (``/static/favicon.ico``) is taskport's SVG.
Compacting a queue is refused (403): RQ's compact moves the whole queue
through a temporary key, so a crash midway loses its jobs and jobs submitted meanwhile jump ahead, and
taskport removes the jobs of ended tasks itself.

Arguments: rq-dashboard 0.9 answers an unknown job, queue, registry, page or Redis instance with a 500 and
a traceback in the log. Each view of this app first checks the ones its URL carries (:func:`argument_problem`)
and answers 404 problem+json naming the one at fault. Its job page renders a job's exception, description
and metadata as HTML, unescaped: they are escaped here (:func:`_escaped`), since a task's error message is a
processor's text. The queue list marks a paused queue (app.web.readiness.QueuePauses) in its name.

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
import html
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
import rq_dashboard
from flask import Flask, Response, current_app, jsonify, request
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from werkzeug.exceptions import MethodNotAllowed

from app.core.config import Config
from app.core.jobs import register_queues
from app.web import requeue
from app.web.errors import AppError, Forbidden, NotFound, Unauthorized, render
from app.web.readiness import QueuePauses

PREFIX = "/rq"
BLUEPRINT = "rq_dashboard"
REALM = 'Basic realm="taskport operators", charset="UTF-8"'
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")  # the ids RQ allows
REGISTRIES = ("queued", "failed", "deferred", "started", "finished", "scheduled", "canceled")  # rq-dashboard's
ORDERS = ("asc", "dsc")
MAX_PER_PAGE = 200  # the job list's own bound (its "jobs per page" field)
ESCAPED = ("exc_info", "description", "metadata")  # what its job page renders as raw HTML
JOB_GONE = "no such job (it may have ended and been trimmed)"


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
    app.add_url_rule(f"{app.static_url_path}/favicon.ico", "favicon", _icon)  # what its pages link
    views = app.view_functions
    views[f"{BLUEPRINT}.compact_queue"] = _refuse_compact
    views[f"{BLUEPRINT}.job_info"] = _escaped(views[f"{BLUEPRINT}.job_info"])
    views[f"{BLUEPRINT}.list_queues"] = _marked_paused(views[f"{BLUEPRINT}.list_queues"], conn)
    for endpoint, view in list(views.items()):
        if endpoint.startswith(f"{BLUEPRINT}."):
            views[endpoint] = _with_connection(view, conn)
    app.before_request(functools.partial(_guard, config.dashboard_user, config.dashboard_password,
                                         mutating_endpoints(app)))


def _icon() -> Response:
    """rq-dashboard's pages link ``/static/favicon.ico`` (its base template), a file taskport has not: its own
    icon (the SVG the task page names) answers there, with its type, so a browser shows it."""
    return current_app.send_static_file("favicon.svg")


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
    """``view`` run with ``conn`` as the dashboard's connection (rq-dashboard's hook replaces it per request),
    once the arguments of its URL name things that exist."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        current_app.redis_conn = conn  # type: ignore[attr-defined]
        register_queues(conn)  # high, default and low listed even before their first job (workers do it too)
        problem = argument_problem(conn, kwargs)
        if problem is not None:
            return render(problem)
        try:
            return view(*args, **kwargs)
        except NoSuchJobError:  # it ended and was trimmed between the check and the read
            return render(_not_found("job_id", JOB_GONE))

    return wrapped


def argument_problem(conn: redis.Redis, args: dict[str, Any]) -> AppError | None:
    """What is wrong with the arguments of a dashboard URL (a 404 naming the one at fault), or None."""
    if args.get("instance_number", 0) != 0:
        return _not_found("instance_number", "this dashboard shows one Redis, instance 0")
    for name in ("per_page", "page"):
        if name in args and not _page_number(args[name], MAX_PER_PAGE if name == "per_page" else None):
            bound = f"1 to {MAX_PER_PAGE}" if name == "per_page" else "1 or more"
            return _not_found(name, f"{name} must be a whole number, {bound}")
    if args.get("order", "asc") not in ORDERS:
        return _not_found("order", "order must be asc or dsc")
    if args.get("registry_name", "queued") not in REGISTRIES:
        return _not_found("registry_name", f"registry_name must be one of {', '.join(REGISTRIES)}")
    queue = args.get("queue_name")
    if queue is not None and not conn.sismember(Queue.redis_queues_keys, Queue.redis_queue_namespace_prefix + queue):
        return _not_found("queue_name", "no such queue")
    job_id = args.get("job_id")
    if job_id is not None and not (JOB_ID.fullmatch(job_id) and conn.exists(Job.key_for(job_id))):
        return _not_found("job_id", JOB_GONE)
    return None


def _page_number(value: Any, most: int | None) -> bool:
    text = str(value)
    return text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= (most or 10**6)


def _not_found(field: str, why: str) -> NotFound:
    return NotFound(why, errors={field: [why]})


def _refuse_compact(queue_name: str) -> Response:
    why = ("compacting a queue is turned off: RQ's compact moves the whole queue through a temporary key (a crash "
           "midway loses its jobs, and jobs submitted meanwhile jump ahead), and taskport removes the jobs of "
           "ended tasks itself")
    return render(Forbidden(why, slug="compact-disabled", title="Compacting is turned off"))


def _escaped(view: Callable[..., Any]) -> Callable[..., Any]:
    """rq-dashboard's job data with the fields its job page renders unescaped (``ESCAPED``) HTML-escaped."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        response, headers = view(*args, **kwargs)
        doc = response.get_json()
        for name in ESCAPED:
            if isinstance(doc.get(name), str):
                doc[name] = html.escape(doc[name])
        return jsonify(doc), response.status_code, headers

    return wrapped


def _marked_paused(view: Callable[..., Any], conn: redis.Redis) -> Callable[..., Any]:
    """rq-dashboard's queue list with ``paused`` on each queue, and " (paused)" after a paused queue's name (the
    name is what its queue page shows; the links stay the queue's own)."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        response, headers = view(*args, **kwargs)
        doc = response.get_json()
        paused = set(QueuePauses(conn).paused())
        for queue in doc.get("queues", []):
            queue["paused"] = queue["name"] in paused
            if queue["paused"]:
                queue["name"] = f"{queue['name']} (paused)"
        return jsonify(doc), response.status_code, headers

    return wrapped


def is_dashboard_path(path: str) -> bool:
    """Whether ``path`` is the dashboard's: every rule of its blueprint is under PREFIX (tests/unit/test_dashboard.py),
    and the path also covers /rq itself (answered by a redirect to /rq/ before any blueprint is known) and unknown
    /rq/... paths, so neither reveals anything without credentials. The path alone, read once: this runs before every
    request (bench/README.md, "Status read, seventh pass")."""
    return path.startswith(PREFIX) and (len(path) == len(PREFIX) or path[len(PREFIX)] == "/")


def _guard(user: str, password: str, mutating: frozenset[str]) -> Response | None:
    """Let a dashboard request through only with the operator's credentials, and a state change only as
    a POST from a page of this host."""
    if not is_dashboard_path(request.path):
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
