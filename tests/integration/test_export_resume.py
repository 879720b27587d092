"""An ``orders.export`` of 200,000 CSV rows whose worker is killed (kill -9) halfway resumes from its last
durable row, and the file downloaded is byte-identical to an uninterrupted export's: on disk and on a real
S3-compatible server (tests/s3server.py), with real web, worker and scheduler processes and a real Redis."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.core import keys
from app.core.config import MIN_PART_SIZE
from tests.integration.harness import Api, Stack, wait_until
from tests.s3server import S3Server, use_s3

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

ROWS = 200_000  # 11 MB of CSV: two 5 MiB parts and a last one on S3


def download(api: Api, task_id: str) -> str:
    file = api.get(f"/api/v1/tasks/{task_id}/result").json()["result"]["file"]
    digest = hashlib.sha256()
    with api.get(file["url"], stream=True) as r:
        assert r.status_code == 200, r.text
        for block in r.iter_content(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def cursor_row(stack: Stack, task_id: str) -> int:
    raw = stack.redis().get(keys.cursor(task_id))
    return int(orjson.loads(raw)["row"]) if raw else 0


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_an_export_killed_halfway_resumes_and_its_file_is_byte_identical(
        where: str, stack: Stack, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings: dict[str, Any] = {"stall_timeout": 1.5, "heartbeat_interval": 0.2, "housekeeping_interval": 1,
                                "scheduler_interval": 0.1, "progress_interval": 0.05, "worker_class": "simple"}
    if where == "s3":
        use_s3(monkeypatch, s3_server)  # the children inherit the AWS variables
        settings |= {"result_store": f"s3://{s3_server.new_bucket()}/tp", "result_part_size": MIN_PART_SIZE}
    stack.configure(data_dir=tmp_path / "host", **settings)
    stack.start_web()
    [victim] = stack.start_worker()
    stack.start_scheduler()
    with Api(stack.base_url, timeout=60) as api:
        reference = api.create("orders.export", {"rows": ROWS}, dedup_key="uninterrupted")
        api.wait_for(reference, "COMPLETED", timeout=60)
        expected = download(api, reference)

        task_id = api.create("orders.export", {"rows": ROWS}, dedup_key="killed")
        wait_until(lambda: cursor_row(stack, task_id) >= ROWS * 0.4, timeout=60, interval=0.01,
                   message="the export's cursor to pass 40 % of its rows")
        stack.kill9(victim)
        saved = cursor_row(stack, task_id)
        stack.start_worker()
        done = api.wait_for(task_id, "COMPLETED", "FAILED", timeout=60)
        assert done["status"] == "COMPLETED", done
        assert (done["attempts"], done["resumed"]) == (1, 1), done
        assert download(api, task_id) == expected
    assert 0 < saved < ROWS
    print(f"{where}: killed with the cursor at row {saved:,} of {ROWS:,}; resumed, byte-identical")
