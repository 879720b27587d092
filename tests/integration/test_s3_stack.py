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

import orjson
import pytest
import requests

from app.process import free_port
from tests.integration.harness import REPO_ROOT, Api, Stack, wait_until
from tests.s3server import S3Server, dead_endpoint, use_s3

ROWS = 950_000  # orders.export CSV rows: just over 50 MiB
OPERATOR = ("admin", "op-secret")


@pytest.fixture
def s3_stack(stack: Stack, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    use_s3(monkeypatch, s3_server)  # children inherit the AWS variables
    bucket = s3_server.new_bucket()
    stack.configure(result_store=f"s3://{bucket}/tp", processors="tests.userprocs.bulky", inline_result_max=4096,
                    dashboard_password=OPERATOR[1], worker_class="simple", data_dir=tmp_path / "web-host",
                    result_store_timeout=1)
    stack.start_web()
    stack.configure(data_dir=tmp_path / "worker-host")
    stack.start_worker()
    yield stack, bucket


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
    cli = subprocess.run([sys.executable, "-m", "app.cli", "audit", "--task", task_id, "--json"], cwd=REPO_ROOT,
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
