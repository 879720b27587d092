"""The Flask class of taskport's web app (``app.create_app``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from flask import Flask, Request
from flask.sessions import NullSession, SecureCookieSession, SecureCookieSessionInterface
from flask.typing import ResponseReturnValue
from werkzeug._internal import _wsgi_decoding_dance
from werkzeug.exceptions import HTTPException
from werkzeug.routing import MapAdapter, RequestRedirect

HOSTS_KEPT = 64  # the distinct hosts whose URL adapter's fixed part TaskportFlask keeps (a client chooses the header)


class _Bound(NamedTuple):
    """What Flask works out from a request's host headers to route it, the same for every request with them."""

    host: str  # request.host
    server_name: str
    subdomain: str | None
    scheme: str


class NoSecretSessions(SecureCookieSessionInterface):
    """Flask's cookie sessions; with no secret key (taskport sets none: no view keeps a session) every request's
    session is one shared NullSession, which refuses every write as the new one Flask makes per request does, ~0.5 µs
    of every request (bench/README.md, "Status read, seventh pass")."""

    null = NullSession()

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if not app.secret_key:
            return self.null
        return super().open_session(app, request)


class TaskportFlask(Flask):
    """Flask, with ``ensure_sync`` answered once per function and the redirects it makes itself relative.

    Flask passes every before/after-request hook and the view through ``ensure_sync`` on every request,
    which asks ``inspect`` whether the function is a coroutine function (~1 µs each, 4–5 per request
    here: bench/README.md, "Status path"). The answer cannot change for a given function, and the set of
    hooks, views and error handlers is fixed once the app is built, so it is kept.
    """

    session_interface = NoSecretSessions()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync: dict[Callable[..., Any], Callable[..., Any]] = {}
        self._bound: dict[tuple[Any, ...], _Bound] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        try:
            return self._sync[func]
        except KeyError:
            sync = self._sync[func] = super().ensure_sync(func)
            return sync
        except TypeError:  # not hashable: answered every time, as by Flask
            return super().ensure_sync(func)

    def create_url_adapter(self, request: Request | None) -> MapAdapter | None:
        """Flask's URL adapter of ``request``, with what depends on its host headers alone (the host validated, its
        port, the server name IDNA-encoded, the subdomain, the scheme) kept per distinct set of those headers, at
        most :data:`HOSTS_KEPT`: werkzeug works them out on every request (~3 µs; bench/README.md, "Status read,
        seventh pass"). The same adapter and ``request.host`` as Flask's (tests/unit/test_webapp.py); Flask's own
        way whenever a setting takes part (SERVER_NAME, TRUSTED_HOSTS, host or subdomain matching)."""
        if request is None or self._routes_by_host():
            return super().create_url_adapter(request)
        env = request.environ
        key = (env.get("HTTP_HOST"), env.get("SERVER_NAME"), env.get("SERVER_PORT"), env["wsgi.url_scheme"],
               env.get("HTTP_CONNECTION"), env.get("HTTP_UPGRADE"))
        bound = self._bound.get(key)
        if bound is None:
            adapter = super().create_url_adapter(request)
            if adapter is not None and len(self._bound) < HOSTS_KEPT:
                self._bound[key] = _Bound(request.host, adapter.server_name, adapter.subdomain, adapter.url_scheme)
            return adapter
        request.host = bound.host
        script_name, path_info, query = env.get("SCRIPT_NAME"), env.get("PATH_INFO"), env.get("QUERY_STRING")
        return MapAdapter(self.url_map, bound.server_name,
                          "/" if script_name is None else _wsgi_decoding_dance(script_name), bound.subdomain,
                          bound.scheme, "/" if path_info is None else _wsgi_decoding_dance(path_info),
                          env["REQUEST_METHOD"], None if query is None else _wsgi_decoding_dance(query))

    def _routes_by_host(self) -> bool:
        config = self.config
        return (config["SERVER_NAME"] is not None or config["TRUSTED_HOSTS"] is not None
                or self.url_map.host_matching or self.subdomain_matching)

    def handle_http_exception(self, e: HTTPException) -> HTTPException | ResponseReturnValue:
        """A routing redirect (``/docs`` -> ``/docs/``, ``/rq`` -> ``/rq/``) to a relative URL: werkzeug builds an
        absolute one from the request's Host header, which the client chooses (``Host: evil.example`` would
        send it to evil.example); the path and query alone say the same (RFC 9110 allows a relative Location)."""
        if isinstance(e, RequestRedirect):
            parts = urlsplit(e.new_url)
            location = f"{parts.path}?{parts.query}" if parts.query else parts.path
            return self.response_class(status=e.code, headers={"Location": location})
        return super().handle_http_exception(e)
