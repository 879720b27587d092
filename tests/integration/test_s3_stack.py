"""Results in S3 with real processes: gunicorn and an RQ worker with SEPARATE data dirs (nothing
shared but Redis and the bucket, as on two hosts), a real redis-server and a real S3-compatible
server on loopback (tests/s3server.py). Also the audit trail as operators read it from that stack."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from app.core import keys
from app.core.process import free_port
from tests.integration.harness import REPO_ROOT, Api, Stack, wait_until
from tests.s3server import S3Server, dead_endpoint, use_s3

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

ROWS = 950_000  # orders.export CSV rows: just over 50 MiB
OPERATOR = ("admin", "op-secret")


def start_s3_stack(stack: Stack, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                   **overrides: Any) -> str:
    """The web and one worker on separate data dirs, results in a new bucket (returned)."""
    use_s3(monkeypatch, s3_server)  # children inherit the AWS variables
    bucket = s3_server.new_bucket()
    stack.configure(result_store=f"s3://{bucket}/tp", processors="tests.userprocs.bulky", inline_result_max=4096,
                    dashboard_password=OPERATOR[1], worker_class="simple", data_dir=tmp_path / "web-host",
                    result_store_timeout=1, **overrides)
    stack.start_web()
    stack.configure(data_dir=tmp_path / "worker-host")
    stack.start_worker()
    return bucket


@pytest.fixture
def s3_stack(stack: Stack, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    yield stack, start_s3_stack(stack, s3_server, monkeypatch, tmp_path)


def test_a_50_mb_export_and_a_large_json_result_cross_hosts_through_s3(
        s3_stack: tuple[Stack, str], s3_server: S3Server, tmp_path: Path) -> None:
    stack, bucket = s3_stack
    with Api(stack.base_url, timeout=60) as api:
        export = api.create("orders.export", {"rows": ROWS})
        bulky = api.create("test.bulky", {"size": 300_000})
        api.wait_for(bulky, "COMPLETED", timeout=30)
        assert api.get(f"/api/v1/tasks/{bulky}/result").json()["result"]["blob"] == "x" * 300_000
        api.wait_for(export, "COMPLETED", timeout=60)
        file = api.get(f"/api/v1/tasks/{export}/result").json()["result"]["file"]
        download, lines, last = hashlib.sha256(), 0, b""
        with api.get(file["url"], stream=True) as r:
            assert r.status_code == 200 and int(r.headers["Content-Length"]) == file["size"] > 50 * 1024 * 1024
            for block in r.iter_content(1024 * 1024):
                download.update(block)
                lines += block.count(b"\n")
                last = (last + block)[-200:]
    stored = hashlib.sha256()
    keys = sorted(s3_server.keys(bucket))
    [export_key] = [k for k in keys if k.endswith(file["name"])]
    body = s3_server.client().get_object(Bucket=bucket, Key=export_key)["Body"]
    for block in body.iter_chunks(1024 * 1024):
        stored.update(block)
    assert download.hexdigest() == stored.hexdigest()
    assert lines == ROWS + 1 and last.splitlines()[-1].startswith(b"ORD-0950000,")
    run = r"run-[0-9a-f]{32}"  # each run writes in a folder of its own
    assert len(keys) == 2 and re.fullmatch(rf"tp/{export}/{run}/{re.escape(file['name'])}", export_key)
    assert any(re.fullmatch(rf"tp/{bulky}/{run}/result\.json", k) for k in keys), keys
    for host in ("web-host", "worker-host"):  # no result file on either host's disk
        scratch = tmp_path / host / "scratch"
        assert not (tmp_path / host / "results").exists()
        assert not scratch.exists() or not any(scratch.iterdir())


def test_operators_read_the_audit_trail_over_http_and_the_cli(s3_stack: tuple[Stack, str]) -> None:
    stack, _ = s3_stack
    with Api(stack.base_url) as api:
        task_id = api.create("test.bulky", {"size": 10})
        api.wait_for(task_id, "COMPLETED")
        assert api.get("/api/v1/audit").status_code == 401
        r = api.get(f"/api/v1/audit?task_id={task_id}", auth=OPERATOR)
    assert r.status_code == 200
    assert [(e["from"], e["to"]) for e in r.json()["entries"]] == [
        ("PROCESSING", "COMPLETED"), ("PENDING", "PROCESSING"), (None, "PENDING")]
    cli = subprocess.run([sys.executable, "-m", "app.launch.cli", "audit", "--task", task_id, "--json"], cwd=REPO_ROOT,
                         env=stack.environ(), capture_output=True, timeout=30, check=True)
    assert [orjson.loads(line)["to"] for line in cli.stdout.splitlines()] == ["COMPLETED", "PROCESSING", "PENDING"]
    assert requests.get(stack.url("/healthz"), timeout=5).status_code == 200


def test_a_web_that_cannot_reach_the_store_answers_503_with_retry_after(
        s3_stack: tuple[Stack, str], s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, _ = s3_stack
    with Api(stack.base_url) as api:
        stored = api.create("orders.export", {"rows": 10})
        api.wait_for(stored, "COMPLETED")
    use_s3(monkeypatch, s3_server, dead_endpoint())  # for the web started from now on
    stack.configure(port=free_port())
    stack.start_web()
    with Api(stack.base_url) as cut_off:
        r = cut_off.get(f"/api/v1/tasks/{stored}/result/file")
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        assert r.headers["Content-Type"] == "application/problem+json"
        assert r.json()["detail"] == "the result store is unreachable, retry shortly"
        assert cut_off.status(stored)["status"] == "COMPLETED"  # the task itself reads as ever


def test_a_cancelled_export_leaves_no_object_and_no_unfinished_upload(
        s3_stack: tuple[Stack, str], s3_server: S3Server) -> None:
    stack, bucket = s3_stack
    with Api(stack.base_url) as api:
        task_id = api.create("orders.export", {"rows": ROWS})
        wait_until(lambda: api.status(task_id)["progress"] >= 40, timeout=30,
                   message="the export to be 40% written (parts of its multipart upload sent)")
        [upload] = s3_server.uploads(bucket)
        assert re.fullmatch(rf"tp/{task_id}/run-[0-9a-f]{{32}}/orders_2026-01-01_2026-12-31\.csv", upload), upload
        assert api.delete(f"/api/v1/tasks/{task_id}").status_code == 204
        api.wait_for(task_id, "CANCELLED")
    wait_until(lambda: not s3_server.uploads(bucket) and not s3_server.keys(bucket), timeout=15,
               message=lambda: f"the upload to be aborted: {s3_server.uploads(bucket)} {s3_server.keys(bucket)}")


def test_a_worker_killed_mid_upload_leaves_no_unfinished_upload_once_the_orphan_sweep_ran(
        stack: Stack, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """kill -9 of the worker while its export is a multipart upload, before it saved a checkpoint (its cursor
    saves wait for the progress interval, an hour here): with no lost run to run again for free
    (TASKPORT_LOST_RUNS=0), stall recovery fails the task with -3 and
    housekeeping's orphan sweep aborts the upload; an upload in progress for a running task stays. (With a
    checkpoint saved, the task resumes instead: tests/integration/test_export_resume.py.)"""
    bucket = start_s3_stack(stack, s3_server, monkeypatch, tmp_path, stall_timeout=2.0, heartbeat_interval=0.2,
                            housekeeping_interval=1, scheduler_interval=0.1, progress_interval=3600, lost_runs=0)
    [victim] = [p for p in stack.procs if p.role == "worker"]
    stack.start_scheduler()
    with Api(stack.base_url) as api:
        lost = api.create("orders.export", {"rows": ROWS})
        wait_until(lambda: api.status(lost)["progress"] >= 20 and s3_server.uploads(bucket), timeout=30,
                   message="the export to be 20% written (parts of its multipart upload sent)")
        stack.kill9(victim)
        stack.start_worker()
        doc = api.wait_for(lost, "FAILED", timeout=15)
        assert doc["error"]["code"] == -3 and doc["attempts"] == 1
        wait_until(lambda: not s3_server.uploads(bucket), timeout=15,
                   message=lambda: f"the orphan sweep to abort the upload: {s3_server.uploads(bucket)}")
        assert s3_server.keys(bucket) == []
        running = api.create("orders.export", {"rows": ROWS - 1})  # another payload: not a duplicate
        wait_until(lambda: s3_server.uploads(bucket), timeout=30, message="the second export's upload to start")
        passes = passes_ended(stack)
        api.wait_for(running, "COMPLETED", timeout=60)
        size = api.get(f"/api/v1/tasks/{running}/result").json()["result"]["file"]["size"]
    swept_meanwhile = passes_ended(stack) - passes
    assert swept_meanwhile >= 1, "no orphan sweep ran while the second export was uploading"
    print(f"\norphan sweeps while the second export was uploading: {swept_meanwhile}")
    [key] = s3_server.keys(bucket)
    assert key.startswith(f"tp/{running}/") and s3_server.uploads(bucket) == []
    assert s3_server.client().head_object(Bucket=bucket, Key=key)["ContentLength"] == size


def passes_ended(stack: Stack) -> int:
    """How many housekeeping expire passes (each one sweeps orphans) have ended so far."""
    conn = stack.redis()
    try:
        return int(conn.hget(keys.STATS, keys.housekeeping_stat("expire")) or 0)
    finally:
        conn.close()
