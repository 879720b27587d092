"""The Flask class of taskport's web app (``app.create_app``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask


class TaskportFlask(Flask):
    """Flask, with ``ensure_sync`` answered once per function.

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
