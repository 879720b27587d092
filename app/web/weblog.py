"""gunicorn's own log lines in taskport's common format (imported only by the web process)."""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger as _GunicornBaseLogger

from app.core.logs import FORMAT, RedactTokenFilter, TaskIdFilter, UTCFormatter

LISTENING = "Listening at: %s (%s)"


class GunicornLogger(_GunicornBaseLogger):  # type: ignore[misc]
    """gunicorn's own lines (arbiter, workers) in the common format.

    gunicorn loads it by name: ``--logger-class app.web.weblog.GunicornLogger``.
    """

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(UTCFormatter(FORMAT))
                handler.addFilter(TaskIdFilter("web"))
                handler.addFilter(RedactTokenFilter())  # the access log's request line carries ?access_token=

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        # With --reuse-port each worker opens its own socket, so gunicorn's arbiter has none to name and
        # logs "Listening at:  (pid)": name the configured address instead.
        if msg == LISTENING and args and not args[0]:
            args = (",".join(f"http://{address}" for address in self.cfg.bind), *args[1:])
        super().info(msg, *args, **kwargs)
