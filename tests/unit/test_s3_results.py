"""Results in the S3 store end to end on fakeredis: a worker writes (in-process SimpleWorker), the API
reads through the Flask test client, housekeeping expires and sweeps; the store is a real
S3-compatible server on loopback, or an endpoint where nothing listens (the outage cases)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from rq import SimpleWorker

from app.core import keys, processors
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.results import SPILLED_REF
from app.core.s3store import S3ResultStore
from app.core.states import QUEUES, ErrorCode
from app.web import create_app
from tests.s3server import S3Server, dead_endpoint, use_s3
from workers import orphans, runner
from workers.housekeeping import Housekeeper, PassReport


@pytest.fixture
def bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    use_s3(monkeypatch, s3_server)
    return s3_server.new_bucket()


@pytest.fixture
def config(tmp_path: Path, bucket: str) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, result_store=f"s3://{bucket}/tp",
                           inline_result_max=1024, processors="tests.userprocs.bulky", retry_backoff="0",
                           result_store_timeout=1)


def run_queued(conn: Any, config: Config) -> None:
    runner.use(runner.Runner(config, conn))
    queues = JobQueue(conn, config).queues
    SimpleWorker([queues[q] for q in QUEUES], connection=conn).work(burst=True)


def submit(client: Any, type_: str, payload: dict[str, Any]) -> str:
    r = client.post("/api/v1/tasks", json={"type": type_, "payload": payload})
    assert r.status_code == 202, r.get_json()
    return str(r.get_json()["task_id"])


def test_a_large_json_result_lives_in_the_store_and_reads_back_transparently(
        client: Any, conn: Any, config: Config, s3_server: S3Server, bucket: str) -> None:
    small, large = submit(client, "test.bulky", {"size": 10}), submit(client, "test.bulky", {"size": 200_000})
    run_queued(conn, config)
    assert client.get(f"/api/v1/tasks/{small}/result").get_json()["result"]["blob"] == "x" * 10
    r = client.get(f"/api/v1/tasks/{large}/result")
    assert r.status_code == 200 and r.get_json()["result"] == {"blob": "x" * 200_000, "size": 200_000}
    in_redis = conn.hget(keys.task(large), "result") or conn.get(keys.result(large))
    assert len(in_redis) < 200 and SPILLED_REF.encode() in in_redis  # only the reference
    [key] = s3_server.keys(bucket)  # in the folder of the run that wrote it
    assert re.fullmatch(rf"tp/{large}/run-[0-9a-f]{{32}}/result\.json", key), key


def test_an_export_downloads_through_the_api(client: Any, conn: Any, config: Config) -> None:
    task_id = submit(client, "orders.export", {"rows": 3000})
    run_queued(conn, config)
    doc = client.get(f"/api/v1/tasks/{task_id}/result").get_json()
    r = client.get(doc["result"]["file"]["url"])
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert int(r.headers["Content-Length"]) == len(r.data) == doc["result"]["file"]["size"]
    lines = r.data.decode().splitlines()
    assert len(lines) == 3001 and lines[-1].startswith("ORD-0003000,")


def test_a_store_down_when_a_worker_writes_retries_then_fails_with_minus_5(
        client: Any, conn: Any, config: Config, s3_server: S3Server, bucket: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    export, bulky = submit(client, "orders.export", {"rows": 10}), submit(client, "test.bulky", {"size": 5000})
    use_s3(monkeypatch, s3_server, dead_endpoint())
    run_queued(conn, config)
    for task_id, attempts in ((export, 1), (bulky, 2)):  # orders.export has no retry, test.bulky one
        doc = client.get(f"/api/v1/tasks/{task_id}").get_json()
        assert doc["status"] == "FAILED" and doc["attempts"] == attempts
        assert doc["error"]["code"] == ErrorCode.RESULT_STORE == -5
    assert "result store unavailable (attempt 1 of 2)" in caplog.text and "Traceback" not in caplog.text
    use_s3(monkeypatch, s3_server)
    assert s3_server.keys(bucket) == [] and s3_server.uploads(bucket) == []


def test_a_store_down_when_a_client_reads_is_503_with_retry_after(
        client: Any, conn: Any, config: Config, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    export, bulky = submit(client, "orders.export", {"rows": 10}), submit(client, "test.bulky", {"size": 5000})
    run_queued(conn, config)
    use_s3(monkeypatch, s3_server, dead_endpoint())
    reader = create_app(config, conn=conn).test_client()  # a web process started while the store is down
    for path in (f"/api/v1/tasks/{export}/result/file", f"/api/v1/tasks/{bulky}/result"):
        r = reader.get(path)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", path
        assert r.headers["Content-Type"] == "application/problem+json"
        assert r.get_json()["detail"] == "the result store is unreachable, retry shortly"


def test_expiry_deletes_the_objects(client: Any, conn: Any, config: Config, s3_server: S3Server, bucket: str) -> None:
    task_id = submit(client, "orders.export", {"rows": 10})
    run_queued(conn, config)
    assert len(s3_server.keys(bucket)) == 1
    hk = Housekeeper(conn, config)
    hk.expire(PassReport("expire"), now=now_ms() + config.result_ttl * 1000 + 1000)
    assert client.get(f"/api/v1/tasks/{task_id}").get_json()["status"] == "EXPIRED"
    assert s3_server.keys(bucket) == []


def test_the_orphan_sweep_removes_files_of_tasks_without_a_result(
        client: Any, conn: Any, config: Config, s3_server: S3Server, bucket: str) -> None:
    kept, failed = submit(client, "orders.export", {"rows": 10}), submit(client, "test.bulky", {"size": 10})
    pending = submit(client, "test.bulky", {"size": 11})
    run_queued(conn, config)
    conn.hset(keys.task(failed), "status", "FAILED")
    conn.hset(keys.task(pending), "status", "PENDING")
    hk = Housekeeper(conn, config)
    assert isinstance(hk.results, S3ResultStore)
    gone = str(uuid.uuid4())
    for task_id in (gone, failed, pending):  # what a delete during an outage or a killed worker leaves
        with hk.results.writer(task_id, "left-over.csv") as fh:
            fh.write(b"x")
    assert orphans.sweep(hk.store, hk.results, batch=2) + orphans.sweep(hk.store, hk.results, batch=2) == 2
    assert sorted(k.split("/")[1] for k in s3_server.keys(bucket)) == sorted([kept, pending])
    report = PassReport("expire")
    hk.expire(report)
    assert report.counts["orphans_removed"] == 0


def test_the_orphan_sweep_aborts_unfinished_uploads_of_tasks_without_a_result_only(
        client: Any, conn: Any, config: Config, s3_server: S3Server, bucket: str) -> None:
    """A folder holding nothing but the multipart upload of a worker killed mid-write (kill -9, OOM)."""
    pending, running, failed = (submit(client, "test.bulky", {"size": n}) for n in (1, 2, 3))
    conn.hset(keys.task(running), "status", "PROCESSING")
    conn.hset(keys.task(failed), "status", "FAILED")  # as stall recovery leaves a lost run's task (-3)
    gone = str(uuid.uuid4())
    for task_id in (pending, running, failed, gone):
        s3_server.start_upload(bucket, f"tp/{task_id}/run-{uuid.uuid4().hex}/export.csv")
    hk = Housekeeper(conn, config)
    assert orphans.sweep(hk.store, hk.results) == 2
    assert sorted(k.split("/")[1] for k in s3_server.uploads(bucket)) == sorted([pending, running])


def test_the_orphan_sweep_waits_out_an_outage(
        conn: Any, config: Config, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    use_s3(monkeypatch, s3_server, dead_endpoint())
    hk = Housekeeper(conn, config)
    processors.load(config.processor_modules)
    assert orphans.sweep(hk.store, hk.results) == 0
    assert "orphan sweep skipped" in caplog.text
