"""One-line failures of the ``taskport`` command, quiet housekeeping logs, gunicorn's bind address, the
rediss:// certificate setting and the /docs page (the real-process side is in tests/integration)."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import redis

from app.core.config import Config
from app.core.connection import connect
from app.core.logs import make_handler
from app.launch import cli
from app.web import create_app
from app.web.weblog import GunicornLogger
from taskport.cli import PIPE_CLOSED
from workers.housekeeping import PassReport


def run_main(capsys, *argv: str) -> tuple[int, list[str]]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip().splitlines()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("REDIS_URL", "PORT", "TASKPORT_LOG_LEVEL", "TASKPORT_HOST"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("role", ["web", "worker"])
def test_no_redis_url_is_one_line_and_exit_2(clean_env, capsys, role):
    code, lines = run_main(capsys, role)
    assert (code, len(lines)) == (cli.EXIT_CONFIG, 1) and "REDIS_URL is not set" in lines[0]


def test_an_unreachable_redis_is_one_line_and_exit_1(clean_env, capsys):
    clean_env.setenv("REDIS_URL", "redis://127.0.0.1:1/0")

    def refused(conn, deadline_s: float = 30.0) -> None:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    clean_env.setattr("workers.scheduler.wait_for_redis", refused)
    code, lines = run_main(capsys, "scheduler")
    assert code == cli.EXIT_FAILURE and lines == [
        "taskport: error: Redis is unreachable (Error 111 connecting to 127.0.0.1:1. Connection refused.): "
        "check REDIS_URL and that Redis runs"]


def test_a_port_in_use_stops_the_web_before_gunicorn(clean_env, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        clean_env.setenv("PORT", str(port))
        clean_env.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
        code, lines = run_main(capsys, "web")
    assert code == cli.EXIT_CONFIG and lines == [
        f"taskport: error: PORT {port} is in use by another process: set PORT to a free one"]


@pytest.mark.parametrize("env, text", [
    ({"PORT": "eighty"}, "PORT must be an integer, got 'eighty'"),
    ({"TASKPORT_LOG_LEVEL": "LOUD"}, "TASKPORT_LOG_LEVEL must be a level name"),
])
def test_a_bad_setting_is_one_line_and_exit_2(clean_env, capsys, env, text):
    for name, value in env.items():
        clean_env.setenv(name, value)
    code, lines = run_main(capsys, "web")
    assert code == cli.EXIT_CONFIG and len(lines) == 1 and text in lines[0]


def test_output_read_by_a_reader_that_went_away_is_no_traceback():
    """``taskport history --json | head``: the reader closes the pipe before the output ends (every command
    of both entry points goes through the same ``output_closed``)."""
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first write, as `head` is after its lines
    try:
        done = subprocess.run([sys.executable, "-m", "app.launch.cli", "config", "--defaults"], stdout=writer,
                              stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (PIPE_CLOSED, b"")


def test_a_pass_that_did_nothing_logs_at_debug_one_that_acted_at_info(caplog):
    caplog.set_level(logging.DEBUG, logger="workers.housekeeping")
    idle = PassReport("monitor", {"failures_in_window": 3, "history_trimmed": 0})
    idle.log(0.001)
    busy = PassReport("expire", {"due": 2, "expired_pending": 2, "history_trimmed": 0})
    busy.log(0.002)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "monitor pass: nothing to do in 0.001 s"),
        (logging.INFO, "expire pass: due=2, expired_pending=2 in 0.002 s"),
    ]


def record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "Job OK (x)", None, None)


def test_the_housekeeper_drops_rqs_info_lines_but_not_its_warnings(monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    quiet, loud = make_handler("housekeeper"), make_handler("worker")
    assert not quiet.filter(record("rq.worker", logging.INFO))
    assert quiet.filter(record("rq.worker", logging.WARNING))
    assert quiet.filter(record("workers.housekeeping", logging.INFO))
    assert loud.filter(record("rq.worker", logging.INFO))
    monkeypatch.setattr(logging.getLogger(), "level", logging.DEBUG)
    assert quiet.filter(record("rq.worker", logging.INFO))


def test_gunicorns_listening_line_names_the_bind_address(caplog):
    logger = GunicornLogger(SimpleNamespace(
        bind=["127.0.0.1:8123"], loglevel="info", errorlog="-", accesslog=None, syslog=False, logconfig=None,
        logconfig_dict={}, logconfig_json=None, capture_output=False, disable_redirect_access_to_syslog=False,
        user=0, group=0))
    seen: list[str] = []
    logger.error_log.handlers[0].emit = lambda r: seen.append(r.getMessage())
    logger.info("Listening at: %s (%s)", "", 4242)
    logger.info("Using worker: %s", "gthread")
    assert seen == ["Listening at: http://127.0.0.1:8123 (4242)", "Using worker: gthread"]


@pytest.mark.parametrize("verify", ["required", "optional", "none"])
def test_a_rediss_url_gets_the_configured_certificate_check(verify):
    conn = connect(Config.from_env({"REDIS_URL": "rediss://h:6380/0", "TASKPORT_REDIS_TLS_VERIFY": verify}))
    assert conn.connection_pool.connection_kwargs["ssl_cert_reqs"] == verify


def test_a_plain_redis_url_gets_no_tls_arguments():
    conn = connect(Config.from_env({"REDIS_URL": "redis://h:6379/0", "TASKPORT_REDIS_TLS_VERIFY": "none"}))
    assert "ssl_cert_reqs" not in conn.connection_pool.connection_kwargs


def test_docs_is_swagger_ui_from_local_files_reading_the_same_document(config, conn):
    client = create_app(config, conn=conn).test_client()
    page = client.get("/docs/")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and page.content_type.startswith("text/html")
    assert '"url": "/api/v1/openapi.json"' in html and '"validatorUrl": null' in html
    loaded = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert loaded and all(url.startswith("/docs/") for url in loaded), loaded  # nothing from a CDN
    for asset in ("swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-ui.css"):
        assert f'"/docs/{asset}"' in html
        with client.get(f"/docs/{asset}") as served:
            assert served.status_code == 200 and len(served.get_data()) > 1000
    assert client.get("/api/v1/openapi.json").get_json()["paths"]["/docs/"]["get"]["summary"]
