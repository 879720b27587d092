"""One log format for every process: UTC time, level, process, logger, task id, message.

    2026-11-29T10:00:00.123Z INFO  worker[4242] workers.runner task_id=2f1c... started orders.split
    2026-11-29T10:00:00.125Z INFO  web[4101] app.web.api.tasks task_id=- open mode: no API keys configured

A line that concerns a task carries its id (log through :func:`task_logger`); every other line shows
``task_id=-``, so ``grep task_id=<id>`` over all processes' output tells one task's story.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

from app.core.clock import utc_second
from app.core.config import Config
from app.core.ids import TASK_ID

FORMAT = "%(asctime)s %(levelname)-5s %(procname)s[%(process)d] %(name)s task_id=%(task_id)s %(message)s"
NO_TASK = "-"


class TaskIdFilter(logging.Filter):
    """Give every record a ``task_id`` (``-`` when it has none) and the process's role name."""

    def __init__(self, procname: str) -> None:
        super().__init__()
        self.procname = procname

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "task_id"):
            record.task_id = _task_id_in_library_line(record)
        record.procname = self.procname
        return True


def _task_id_in_library_line(record: logging.LogRecord) -> str:
    """RQ names the job (id = task id) in its own lines ("default: Job OK (2f1c...)"): stamp it."""
    if record.name.startswith("rq."):
        found = TASK_ID.search(record.getMessage())
        if found:
            return found.group(0)
    return NO_TASK


# A read token in a query string (RFC 6750's access_token, app.web.auth), however it is encoded in a URL
TOKEN_IN_QUERY = re.compile(r"(access_token=)[^&\s\"']*", re.IGNORECASE)
REDACTED = r"\1[redacted]"


class RedactTokenFilter(logging.Filter):
    """Take read tokens out of every line: an ``access_token=...`` in a request line (gunicorn's access log), a
    URL in an error, a library's debug line. The record's message is rendered once here, only when it has one."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "access_token" in message.lower():
            record.msg, record.args = TOKEN_IN_QUERY.sub(REDACTED, message), None
        return True


QUIET_PROCESSES = frozenset({"housekeeper"})


class QuietLibraryFilter(logging.Filter):
    """Drop RQ's INFO lines (dequeued, "Job OK", "result will never expire...") in a process that only runs
    housekeeping: each pass would add three of them every interval. The pass itself logs one line when
    it did something (workers.housekeeping); RQ's warnings and errors still pass, and at DEBUG everything does."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("rq.") and record.levelno == logging.INFO
                    and logging.getLogger().getEffectiveLevel() > logging.DEBUG)


class UTCFormatter(logging.Formatter):
    """ISO 8601 UTC timestamps with milliseconds and a trailing ``Z``, like the API's."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{utc_second(int(record.created))}.{int(record.msecs):03d}Z"


class TaskLogger(logging.LoggerAdapter):
    """A logger adapter that stamps its task's id on every record (and keeps a caller's own ``extra``)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def task_logger(logger: logging.Logger, task_id: str) -> logging.LoggerAdapter:
    """``logger`` whose lines all show ``task_id=<task_id>``."""
    return TaskLogger(logger, {"task_id": task_id})


class CommonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler of the common format (:func:`make_handler`), which can also write a task's line without
    a record (:meth:`task_line`, for :func:`log_task`)."""

    def __init__(self, procname: str) -> None:
        super().__init__(sys.stderr)
        self.procname = procname
        self.setFormatter(UTCFormatter(FORMAT))
        self.addFilter(TaskIdFilter(procname))
        self.addFilter(RedactTokenFilter())
        if procname in QUIET_PROCESSES:
            self.addFilter(QuietLibraryFilter())
        self._own = (self.formatter, list(self.filters))  # as made: what task_line renders the same as

    def task_line(self, level: int, name: str, task_id: str, msg: str, args: tuple[Any, ...]) -> bool:
        """Write the line that a record of logger ``name`` at ``level`` with ``task_id`` would give through this
        handler (its filters, then its formatter), the same to the character, without making the record: False,
        writing nothing, when this handler's formatter or filters are no longer its own (the record is needed)."""
        if level < self.level or (self.formatter, self.filters) != self._own or name.startswith("rq."):
            return False
        if args and len(args) == 1 and isinstance(args[0], Mapping) and args[0]:
            return False  # a record takes a lone mapping as the arguments themselves
        created = time.time()  # as a LogRecord reads its time, formatted as UTCFormatter.formatTime
        second = int(created)
        message = str(msg) % args if args else str(msg)  # LogRecord.getMessage
        if "access_token" in message.lower():  # RedactTokenFilter
            message = TOKEN_IN_QUERY.sub(REDACTED, message)
        line = (f"{utc_second(second)}.{int((created - second) * 1000):03d}Z {logging.getLevelName(level):<5} "
                f"{self.procname}[{os.getpid()}] {name} task_id={task_id} {message}")  # FORMAT
        self.acquire()  # Handler.handle, then StreamHandler.emit
        try:
            self.stream.write(line + self.terminator)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(logging.LogRecord(name, level, "(unknown file)", 0, msg, args, None))
        finally:
            self.release()
        return True


def make_handler(procname: str) -> logging.StreamHandler[TextIO]:
    """A stderr handler in the common format, for the process named ``procname`` (web, worker...)."""
    handler = CommonHandler(procname)
    handler.set_name(f"taskport-{procname}")
    return handler


def setup_logging(config: Config, process: str) -> None:
    """Send every logger's records through one stderr handler in the common format.

    Idempotent: a second call (e.g. a second ``create_app`` in tests) replaces the handler, never
    duplicates it. RQ sees that the root logger has a handler and adds none of its own.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if (h.get_name() or "").startswith("taskport-")]:
        root.removeHandler(old)
    root.addHandler(make_handler(process))
    root.setLevel(config.log_level_name)
    # what FORMAT never shows, no record works out (logging's own switches): the caller's file and line (a walk
    # up the stack), the thread's name and the multiprocessing process's name; ~1% of a delivery's worker CPU
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logMultiprocessing = False


def rq_log_level(config: Config) -> str:
    """RQ's own level in a worker (a task worker, the deliverer): its per-job lines at INFO (dequeued, Job OK)
    would say again what taskport's lines of the task say (started, completed, with the task id), and cost a
    record, a format and a write each, about a tenth of a no-op delivery's CPU (bench/README.md); its warnings
    and errors still pass, and at DEBUG everything does."""
    level = logging.getLevelNamesMapping()[config.log_level_name]
    return config.log_level_name if level <= logging.DEBUG else logging.getLevelName(max(level, logging.WARNING))


def log_task(logger: logging.Logger, level: int, task_id: str, msg: str, *args: Any) -> None:
    """``task_logger(logger, task_id).log(level, msg, *args)``, the same line, for a hot path (a submit's): no
    adapter, and no walk up the stack for the caller's file and line, which the common format does not show
    (~4 µs of ~12 a line: bench/README.md, "Submit, sixth pass"). When the line's one handler is the common
    one as made (a process's usual case), it writes the line itself, without a record (:meth:`CommonHandler.task_line`,
    ~3 µs of ~8 left: "Submit, eighth pass"); any other set of handlers or filters gets the record."""
    if not logger.isEnabledFor(level):
        return
    handler = _sole_common_handler(logger)
    if handler is None or not handler.task_line(level, logger.name, task_id, msg, args):
        logger.handle(logger.makeRecord(logger.name, level, "(unknown file)", 0, msg, args, None, None,
                                        {"task_id": task_id}))


def _sole_common_handler(logger: logging.Logger) -> CommonHandler | None:
    """The one handler a record of ``logger`` would reach (Logger.callHandlers' walk), when it is a
    :class:`CommonHandler` and ``logger`` has no filter of its own; else None."""
    if logger.filters:
        return None
    found: logging.Handler | None = None
    walked: logging.Logger | None = logger
    while walked is not None:
        for handler in walked.handlers:
            if found is not None:
                return None
            found = handler
        walked = walked.parent if walked.propagate else None
    return found if type(found) is CommonHandler else None
