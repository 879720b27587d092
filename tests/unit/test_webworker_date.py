"""app.web.webworker.http_date: gunicorn's Date header, made once a second, the same text."""

from __future__ import annotations

import random
import time

from gunicorn import util as gunicorn_util

from app.web import webworker
from app.web.webworker import http_date

GUNICORN_HTTP_DATE = gunicorn_util.http_date


def test_the_same_text_as_gunicorns() -> None:
    rng = random.Random(32)
    stamps = [0.0, 0.999, 1.0, 1_796_000_000.5, 1_796_000_000.999999]
    stamps += [rng.uniform(0, 4_102_444_800) for _ in range(2_000)]
    for stamp in stamps + stamps:
        assert http_date(stamp) == GUNICORN_HTTP_DATE(stamp), stamp
    before = GUNICORN_HTTP_DATE()
    now = http_date()
    assert now in (before, GUNICORN_HTTP_DATE())  # a second may turn between the two
    assert time.strptime(now, "%a, %d %b %Y %H:%M:%S GMT")


def test_a_worker_process_dates_its_responses_with_it(monkeypatch) -> None:
    monkeypatch.setattr(gunicorn_util, "http_date", GUNICORN_HTTP_DATE)
    monkeypatch.setattr(gunicorn_util, "write_error", gunicorn_util.write_error)
    from gunicorn.http import message, wsgi

    for module, name in ((wsgi, "Response"), (wsgi, "base_environ"), (message, "_ip_in_allow_list")):
        monkeypatch.setattr(module, name, getattr(module, name))

    class Base:
        def init_process(self) -> None:
            pass

    class Worker(webworker.ProblemErrors, Base):
        pass

    Worker().init_process()
    assert gunicorn_util.http_date is http_date
