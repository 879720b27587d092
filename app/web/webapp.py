"""The Flask class of taskport's web app (``app.create_app``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flask import Flask
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect


class TaskportFlask(Flask):
    """Flask, with ``ensure_sync`` answered once per function and the redirects it makes itself relative.

    Flask passes every before/after-request hook and the view through ``ensure_sync`` on every request,
    which asks ``inspect`` whether the function is a coroutine function (~1 µs each, 4–5 per request
    here: bench/README.md, "Status path"). The answer cannot change for a given function, and the set of
    hooks, views and error handlers is fixed once the app is built, so it is kept.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync: dict[Callable[..., Any], Callable[..., Any]] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        try:
            return self._sync[func]
        except KeyError:
            sync = self._sync[func] = super().ensure_sync(func)
            return sync
        except TypeError:  # not hashable: answered every time, as by Flask
            return super().ensure_sync(func)

    def handle_http_exception(self, e: HTTPException) -> HTTPException | ResponseReturnValue:
        """A routing redirect (``/docs`` -> ``/docs/``, ``/rq`` -> ``/rq/``) to a relative URL: werkzeug builds an
        absolute one from the request's Host header, which the client chooses (``Host: evil.example`` would
        send it to evil.example); the path and query alone say the same (RFC 9110 allows a relative Location)."""
        if isinstance(e, RequestRedirect):
            parts = urlsplit(e.new_url)
            location = f"{parts.path}?{parts.query}" if parts.query else parts.path
            return self.response_class(status=e.code, headers={"Location": location})
        return super().handle_http_exception(e)
