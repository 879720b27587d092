"""taskport's web app: ``create_app()`` wires config, Redis, processors, views and error handlers."""

from __future__ import annotations

import redis
from flask import Flask

from app.config import Config


def create_app(config: Config | None = None, conn: redis.Redis | None = None) -> Flask:
    """Build the Flask app. ``config`` defaults to the environment; ``conn`` lets tests pass fakeredis."""
    from app import errors
    from app.api import health, tasks
    from app.logs import setup_logging
    from app.runtime import Runtime
    from workers import processors

    config = config or Config.from_env()
    setup_logging(config, "web")
    processors.load(config.processor_modules)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body
    app.json.sort_keys = False  # type: ignore[attr-defined]
    Runtime.build(config, conn).init_app(app)
    errors.init_app(app)
    app.register_blueprint(tasks.bp)
    app.register_blueprint(health.bp)
    return app
