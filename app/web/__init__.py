"""The web wing: the Flask app (``create_app``), its views (``api/``), auth, limits, problem rendering,
event streams, the gunicorn workers, the dashboard and the documents.

It imports the core (:mod:`app.core`), never the workers or the launcher; nothing outside the web imports
it but the launcher, which names its gunicorn target and worker classes by dotted strings.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.config import Config

if TYPE_CHECKING:  # the worker and scheduler import this package too: they need neither Flask nor a web stack
    import redis
    from flask import Flask


def create_app(config: Config | None = None, conn: redis.Redis | None = None) -> Flask:
    """Build the Flask app. ``config`` defaults to the environment; ``conn`` lets tests pass fakeredis."""
    from app.core import processors
    from app.core.logs import setup_logging
    from app.web import auth, cors, dashboard, errors, limits, metrics
    from app.web.api import audit, batches, docs, events, health, page, schedules, tasks
    from app.web.api import metrics as metrics_api
    from app.web.api import tokens as tokens_api
    from app.web.runtime import Runtime
    from app.web.webapp import TaskportFlask

    config = config or Config.from_env()
    setup_logging(config, "web")
    processors.load(config.processor_modules)
    app = TaskportFlask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body
    app.json.sort_keys = False  # type: ignore[attr-defined]
    rt = Runtime.build(config, conn)
    rt.init_app(app)
    metrics.init_app(app, rt.redis)  # first, so its hooks time every request
    errors.init_app(app)
    auth.init_app(app, config, rt.members)
    cors.init_app(app, config)  # before the limiter: a preflight carries no key
    limits.init_app(app, config, rt.members, rt.redis)
    dashboard.init_app(app, config, rt.redis)
    for blueprint in (tasks.bp, events.bp, docs.bp, health.bp, metrics_api.bp, page.bp, audit.bp, schedules.bp,
                      batches.bp, tokens_api.bp):
        app.register_blueprint(blueprint)
    from app.web.api import output  # a task's live output (GET /tasks/{id}/output)
    app.register_blueprint(output.bp)
    from app.core import tracing  # OpenTelemetry, when the otel extra is installed and OTEL_* ask for it
    if tracing.setup("web"):
        from flask import request

        app.wsgi_app = tracing.Middleware(app.wsgi_app)  # type: ignore[method-assign]
        app.before_request(lambda: tracing.name_route(request.method,
                                                      request.url_rule.rule if request.url_rule else None))
    return app
