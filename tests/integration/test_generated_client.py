"""A client generated from the served OpenAPI document (openapi-python-client, docs/clients.md "Generated clients")
works against a real stack: every route is generated, typed, and the calls a user makes first succeed.

The generator is run on the document a stack serves (callbacks enabled, open mode) and on the one of a deployment
without callback secrets, with API keys; neither may print a warning. The events streams are generated as calls
that leave the stream to the caller (``response.content``): their events are documented as ``itemSchema``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
import requests

from app.web.api import docs
from tests.integration.harness import Stack, started_stack, wait_until

GENERATOR = Path(sys.executable).with_name("openapi-python-client")
PACKAGE = "taskport_generated"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # callbacks on: the document offers them


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("generated"), callback_secrets=f"public:{SECRET}",
                       callback_allow_hosts="127.0.0.1") as s:
        yield s


def generate(document: bytes, workdir: Path) -> str:
    """Run the generator on ``document`` into ``workdir``/PACKAGE; returns what it printed."""
    spec = workdir / "openapi.json"
    spec.write_bytes(document)
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # its ruff hooks
    done = subprocess.run([str(GENERATOR), "generate", "--path", str(spec), "--output-path",
                           str(workdir / PACKAGE), "--meta", "none"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def client_package(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    workdir = tmp_path_factory.mktemp("client")
    output = generate(requests.get(stack.url("/api/v1/openapi.json"), timeout=10).content, workdir)
    assert "Warning" not in output and "WARNING" not in output, output  # no route, response or schema dropped
    sys.path.insert(0, str(workdir))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(workdir))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def test_the_document_without_callbacks_and_with_keys_generates_without_warnings(tmp_path: Path) -> None:
    output = generate(orjson.dumps(docs.build_spec(True, callbacks=False).to_dict()), tmp_path)
    assert "Warning" not in output and "WARNING" not in output, output


def _api(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.default.{name}")


def _model(package: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def _finished(package: ModuleType, client: Any, task_id: Any) -> Any:
    get_task = _api(package, "get_task")
    return wait_until(lambda: (doc := get_task.sync(task_id, client=client)).status.value == "COMPLETED" and doc,
                      timeout=30, message="task COMPLETED")


def test_submit_status_result_file_batch_schedule(client_package: ModuleType, stack: Stack) -> None:
    with importlib.import_module(f"{PACKAGE}.client").Client(stack.base_url, raise_on_unexpected_status=True) as client:
        _round_trips(client_package, client)


def _round_trips(client_package: ModuleType, client: Any) -> None:
    submit = _api(client_package, "submit_task")
    accepted = submit.sync(client=client, body=_model(client_package, "TaskSubmitRequestDemoSleep").from_dict(
        {"type": "demo.sleep", "payload": {"seconds": 0.1, "steps": 2, "items": 3}}))
    doc = _finished(client_package, client, accepted.task_id)
    assert (doc.items.total, doc.items.succeeded, doc.items.failed) == (3, 3, 0)  # typed: Items, not a dict
    assert doc.error is None
    result = _api(client_package, "get_result").sync(accepted.task_id, client=client)
    assert result.status.value == "COMPLETED" and result.items.total == 3

    export = submit.sync(client=client, body=_model(client_package, "TaskSubmitRequestOrdersExport").from_dict(
        {"type": "orders.export", "payload": {"rows": 5}}))
    _finished(client_package, client, export.task_id)
    file = _api(client_package, "get_result_file").sync(export.task_id, client=client)
    assert type(file).__name__ == "File"
    assert file.payload.read().decode().splitlines()[0].startswith("order_code,")

    batch = _api(client_package, "submit_batch").sync(client=client, body=_model(client_package, "BatchRequest")
                                                       .from_dict({"tasks": [{"type": "demo.sleep", "payload": {}}],
                                                                   "then": {"type": "demo.sleep", "payload": {}}}))
    read = _api(client_package, "get_batch").sync(batch.batch_id, client=client)
    assert read.batch_id == batch.batch_id and read.size == 1

    schedule = _api(client_package, "create_schedule").sync(client=client, body=_model(
        client_package, "ScheduleCreate").from_dict({"cron": "0 3 * * *", "task": {
            "type": "demo.sleep", "payload": {"seconds": 1},
            "callback": {"url": "http://127.0.0.1:9/hook", "events": ["COMPLETED"]}}}))
    changed = _api(client_package, "update_schedule").sync(schedule.schedule_id, client=client, body=_model(
        client_package, "ScheduleUpdate").from_dict({"paused": True, "task": {"type": "demo.sleep",
                                                                             "payload": {"seconds": 2}}}))
    assert changed.paused is True and changed.next_run_at is None and changed.task.payload["seconds"] == 2

    # the stream: the call returns without parsing it; its events are in the response's content
    events = _api(client_package, "get_events").sync_detailed(accepted.task_id, client=client)
    assert events.status_code == 200 and events.parsed is None
    assert b"event: status" in events.content and b"COMPLETED" in events.content
