"""app.web.webworker.SettledConfig: a worker's gunicorn settings, each kept once read, the same values."""

from __future__ import annotations

from gunicorn.config import Config

from app.web import webworker
from app.web.webworker import SettledConfig


def configured() -> Config:
    cfg = Config()
    cfg.set("keepalive", 7)
    cfg.set("limit_request_line", 1234)
    cfg.set("bind", ["127.0.0.1:9999"])
    return cfg


def test_every_setting_reads_as_gunicorns_and_is_kept() -> None:
    plain, settled = configured(), configured()
    settled.__class__ = SettledConfig
    for name in plain.settings:
        assert getattr(settled, name) == getattr(plain, name), name
    assert settled.__dict__["keepalive"] == 7  # read once: later reads are plain attribute hits
    assert settled.limit_request_line == 1234
    assert settled.address == plain.address  # a property of the class, computed as before
    assert settled.is_ssl == plain.is_ssl


def test_a_worker_process_reads_its_settings_settled(monkeypatch) -> None:
    from gunicorn import util as gunicorn_util

    monkeypatch.setattr(gunicorn_util, "http_date", gunicorn_util.http_date)
    monkeypatch.setattr(gunicorn_util, "write_error", gunicorn_util.write_error)
    from gunicorn.http import message, wsgi

    for module, name in ((wsgi, "Response"), (wsgi, "base_environ"), (message, "_ip_in_allow_list")):
        monkeypatch.setattr(module, name, getattr(module, name))

    class Base:
        def init_process(self) -> None:
            pass

    class Worker(webworker.ProblemErrors, Base):
        cfg = configured()

    worker = Worker()
    worker.init_process()
    assert type(worker.cfg) is SettledConfig
    assert worker.cfg.keepalive == 7
