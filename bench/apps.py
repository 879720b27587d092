"""The bench's WSGI app: taskport's own app plus the two baseline routes, served with ``taskport web``'s flags.

    /bench/hello   a hello-world JSON answer: the framework ceiling (gunicorn + Flask + our JSON helper)
    /bench/get     exactly one Redis GET of a small key, answered as JSON: the floor of a status read

Both render through ``app.web.api.json_response``, like every taskport view, so the only difference from
a status read is what the view does in between.
"""

from __future__ import annotations

from flask import Flask, Response

from app.web import create_app
from app.web.api import json_response
from app.web.runtime import runtime

GET_KEY = "{tp}:bench:get"
GET_VALUE = "a small value of about the size of a status field"


def hello() -> Response:
    return json_response({"hello": "world"})


def one_get() -> Response:
    value = runtime().redis.get(GET_KEY)
    return json_response({"value": value.decode() if isinstance(value, bytes) else value})


def create_bench_app() -> Flask:
    """``create_app()`` from the environment, plus the baseline routes."""
    app = create_app()
    app.add_url_rule("/bench/hello", "bench_hello", hello, methods=["GET"])
    app.add_url_rule("/bench/get", "bench_get", one_get, methods=["GET"])
    return app


def create_bare_app() -> Flask:
    """A bare Flask app, outside taskport's middleware (no metrics, request logging, auth, limits or error
    handlers): ``/bench/get`` does the same one Redis GET through a plain redis-py client and renders
    the same JSON with orjson. Status vs this = what a status read costs over the physical floor;
    in-app ``/bench/get`` vs this = what taskport's per-request middleware costs."""
    import os

    import orjson
    import redis

    bare = Flask("bare")
    conn = redis.Redis.from_url(os.environ["REDIS_URL"])

    def bare_get() -> Response:
        value = conn.get(GET_KEY)
        body = orjson.dumps({"value": value.decode() if isinstance(value, bytes) else value})
        return Response(body, 200, content_type="application/json")

    def bare_hello() -> Response:
        return Response(orjson.dumps({"hello": "world"}), 200, content_type="application/json")

    bare.add_url_rule("/bench/get", "bare_get", bare_get, methods=["GET"])
    bare.add_url_rule("/bench/hello", "bare_hello", bare_hello, methods=["GET"])
    return bare
