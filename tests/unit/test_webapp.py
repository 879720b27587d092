"""TaskportFlask: the URL adapter it makes from what it kept of a host is the one Flask makes."""

from __future__ import annotations

import pytest
from flask import Flask, session
from flask.sessions import NullSession
from werkzeug.test import EnvironBuilder

from app.web.webapp import HOSTS_KEPT, TaskportFlask

ENVIRONS = [
    {},
    {"HTTP_HOST": "localhost:8000"},
    {"HTTP_HOST": "Example.COM"},
    {"HTTP_HOST": "example.com:80"},
    {"HTTP_HOST": "example.com:443", "wsgi.url_scheme": "https"},
    {"HTTP_HOST": "[::1]:8000"},
    {"HTTP_HOST": "bücher.example"},
    {"HTTP_HOST": "bad host\\name"},
    {"HTTP_HOST": "localhost", "HTTP_CONNECTION": "keep-alive, Upgrade", "HTTP_UPGRADE": "websocket"},
    {"HTTP_HOST": None, "SERVER_NAME": "10.0.0.1", "SERVER_PORT": "8080"},
    {"HTTP_HOST": None, "SERVER_NAME": "::1", "SERVER_PORT": "443", "wsgi.url_scheme": "https"},
    {"HTTP_HOST": "localhost", "SCRIPT_NAME": "/base", "QUERY_STRING": "a=1&b=%C3%A9"},
    {"HTTP_HOST": "localhost", "PATH_INFO": "/api//v1/tasks/caf\xc3\xa9", "REQUEST_METHOD": "HEAD"},
]


def adapters(app: Flask, overrides: dict[str, str | None]) -> tuple[dict[str, object], str]:
    environ = EnvironBuilder(path="/api/v1/tasks/x", query_string="q=1").get_environ()
    for name, value in overrides.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    request = app.request_class(environ)
    adapter = app.create_url_adapter(request)
    assert adapter is not None
    return vars(adapter), request.host


@pytest.mark.parametrize("overrides", ENVIRONS)
def test_the_adapter_of_a_kept_host_is_flasks(overrides):
    app, plain = TaskportFlask(__name__), Flask(__name__)
    expected = adapters(plain, overrides)
    first = adapters(app, overrides)  # worked out, and kept
    again = adapters(app, overrides)  # from what was kept
    for found in (first, again):
        assert {**found[0], "map": None} == {**expected[0], "map": None}
        assert found[1] == expected[1]
    assert len(app._bound) == 1


def test_settings_that_route_by_host_take_flasks_way_and_hosts_kept_are_bounded():
    app = TaskportFlask(__name__)
    app.config["SERVER_NAME"] = "example.com"
    adapters(app, {"HTTP_HOST": "example.com"})
    assert app._bound == {}
    app = TaskportFlask(__name__)
    for i in range(HOSTS_KEPT + 5):
        adapters(app, {"HTTP_HOST": f"host{i}.example"})
    assert len(app._bound) == HOSTS_KEPT
    assert adapters(app, {"HTTP_HOST": "late.example"})[1] == "late.example"


def test_without_a_secret_key_the_session_is_a_null_one_that_refuses_writes():
    app = TaskportFlask(__name__)

    @app.get("/read")
    def read() -> str:
        return str(session.get("a"))

    @app.get("/write")
    def write() -> str:
        session["a"] = 1
        return "written"

    client = app.test_client()
    assert client.get("/read").text == "None"
    assert client.get("/write").status_code == 500  # NullSession: "the session is unavailable"
    with app.test_request_context("/"):
        assert isinstance(session._get_current_object(), NullSession)  # type: ignore[attr-defined]
    app.secret_key = "s"
    assert client.get("/write").text == "written"
    assert "session=" in client.get("/write").headers["Set-Cookie"]
