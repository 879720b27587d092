"""The common log format: every line that concerns a task carries its id."""

from __future__ import annotations

import logging
import time

from app.core.logs import TaskIdFilter, make_handler, task_logger

TASK = "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21"


def render(record: logging.LogRecord) -> str:
    handler = make_handler("worker")
    assert all(f.filter(record) for f in handler.filters)  # type: ignore[union-attr]
    return handler.format(record)


def record(name: str, msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(name, logging.INFO, __file__, 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def test_task_logger_stamps_its_task():
    adapter = task_logger(logging.getLogger("workers.runner"), TASK)
    _, kwargs = adapter.process("started", {})
    assert render(record("workers.runner", "started", **kwargs["extra"])).count(f"task_id={TASK}") == 1


def test_rq_lines_get_the_job_id_they_name():
    assert f"task_id={TASK}" in render(record("rq.worker", f"default: Job OK ({TASK})"))


def test_other_lines_show_a_dash():
    assert "task_id=- " in render(record("app.web.auth", f"not a task line {TASK}"))
    assert "task_id=- " in render(record("rq.worker", "*** Listening on high, default, low..."))


def test_filter_keeps_an_explicit_task_id():
    rec = record("rq.worker", f"mentions {TASK}", task_id="other")
    TaskIdFilter("worker").filter(rec)
    assert rec.task_id == "other"


def test_times_are_utc_iso_with_milliseconds_across_seconds():
    for created in (1_796_640_001.0, 1_796_640_001.9994, 1_796_640_002.0205, 1_796_640_001.5):
        rec = record("workers.runner", "completed")
        rec.created, rec.msecs = created, int((created - int(created)) * 1000) + 0.0
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(rec.msecs):03d}Z"
        assert render(rec).startswith(expected + " INFO "), render(rec)


def test_log_task_writes_the_adapters_line(monkeypatch):
    """log_task (the submit's line without the adapter and the caller lookup) renders the line task_logger's
    does, to the character once the time is the same, and writes nothing below the logger's level."""
    from app.core.logs import log_task

    logger = logging.getLogger("app.web.service")
    seen: list[logging.LogRecord] = []
    monkeypatch.setattr(logger, "handle", seen.append)
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(time, "time_ns", lambda: 1_796_640_001_234_000_000)  # the record's time, whichever
    monkeypatch.setattr(time, "time", lambda: 1_796_640_001.234)  # Python reads
    task_logger(logger, TASK).info("submitted %s by %s on queue %s", "demo.sleep", "public", "default")
    log_task(logger, logging.INFO, TASK, "submitted %s by %s on queue %s", "demo.sleep", "public", "default")
    theirs, ours = (render(r) for r in seen)
    assert ours == theirs and f"task_id={TASK} submitted demo.sleep by public on queue default" in ours
    log_task(logger, logging.DEBUG, TASK, "not written")
    assert len(seen) == 2


def _common_logger(monkeypatch, name: str = "app.web.service"):
    """``name``'s logger whose records reach one common handler (writing to a StringIO) and nothing else."""
    import io

    from app.core.logs import CommonHandler

    handler = make_handler("web")
    assert type(handler) is CommonHandler
    handler.setStream(io.StringIO())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "propagate", True)
    logger._cache.clear()  # type: ignore[attr-defined]
    return logger, handler


def _lines(handler: logging.StreamHandler) -> list[str]:  # type: ignore[type-arg]
    return handler.stream.getvalue().splitlines()  # type: ignore[no-any-return]


def test_log_task_without_a_record_writes_the_records_line(monkeypatch):
    """The common handler's direct path (no LogRecord) writes what the record through the same handler writes,
    to the character: the time, level, process, logger, task id and message, a read token redacted."""
    from app.core.logs import log_task

    logger, handler = _common_logger(monkeypatch)
    made: list[logging.LogRecord] = []
    real_make = logger.makeRecord
    monkeypatch.setattr(logger, "makeRecord", lambda *a, **k: made.append(real_make(*a, **k)) or made[-1])
    for created in (1_796_640_001.234, 1_796_640_002.9995, 1_796_640_003.0):
        monkeypatch.setattr(time, "time", lambda created=created: created)
        for args in (("demo.sleep", "public", "default"), ("demo.sleep", "x?access_token=secret", "low")):
            log_task(logger, logging.INFO, TASK, "submitted %s by %s on queue %s", *args)
            task_logger(logger, TASK).info("submitted %s by %s on queue %s", *args)
    assert len(made) == 6  # the adapter's records only: log_task made none
    ours, theirs = _lines(handler)[0::2], _lines(handler)[1::2]
    assert ours == theirs and len(ours) == 6
    assert "secret" not in "".join(ours)
    assert f"task_id={TASK} submitted demo.sleep by public on queue default" in ours[0]


def test_log_task_makes_the_record_when_another_handler_or_filter_would_see_it(monkeypatch):
    """Another handler on the way, a filter on the logger or the handler, another formatter: the record is made and
    handled as logging does (no line is written twice, none is lost)."""
    from app.core.logs import log_task

    logger, handler = _common_logger(monkeypatch)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    monkeypatch.setattr(logger, "handlers", [Keep()])
    log_task(logger, logging.INFO, TASK, "one")
    assert [r.task_id for r in seen] == [TASK] and len(_lines(handler)) == 1  # type: ignore[attr-defined]
    monkeypatch.setattr(logger, "handlers", [])
    dropped = logging.Filter("somewhere.else")  # drops every record of this logger
    logger.addFilter(dropped)
    log_task(logger, logging.INFO, TASK, "two")
    logger.removeFilter(dropped)
    handler.addFilter(dropped)
    log_task(logger, logging.INFO, TASK, "three")
    handler.removeFilter(dropped)
    handler.setFormatter(logging.Formatter("%(task_id)s|%(message)s"))
    log_task(logger, logging.INFO, TASK, "four")
    assert _lines(handler)[1:] == [f"{TASK}|four"]
