"""The client distribution alone (taskport-client, clients/python): a fresh venv with nothing else installed
submits a task, waits for it and fetches its result from a real stack with its own ``taskport`` command;
importing the client loads no Flask, RQ or redis, and the venv holds no top-level ``app`` or ``workers``.

The venv is built from a copy of clients/python (so the distribution stands on its own, reaching nothing else
of the checkout) by uv, the installer the Makefile uses (pip does the same, in ~16 s here against ~3 s), from
its cache; the commands run outside the checkout, so the service's packages are not importable from the
working directory either.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from taskport.cli import COMMANDS
from tests.integration.harness import REPO_ROOT, Stack, started_stack

INSTALL_TIMEOUT = 180  # seconds: ~3 s from uv's cache here; a cold cache downloads httpx, rich and theirs
RUN_TIMEOUT = 60
SERVICE_MODULES = ("flask", "rq", "rq_scheduler", "redis", "gunicorn", "gevent", "app", "workers")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-dist")
    source = root / "source"
    shutil.copytree(REPO_ROOT / "clients" / "python", source,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=INSTALL_TIMEOUT)
    uv = Path(sys.executable).parent / "uv"
    done = subprocess.run([str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(source)],
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, done.stderr
    return venv


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("client-dist-stack")) as s:
        yield s


def run(venv: Path, *args: str, cwd: Path, url: str = "") -> subprocess.CompletedProcess[str]:
    """A command of the venv, with none of this process's venv, path or taskport settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("TASKPORT_")}
    env["TASKPORT_URL"] = url
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)


def test_the_client_alone_submits_waits_and_fetches_the_result(venv: Path, stack: Stack, tmp_path: Path) -> None:
    payload = {"seconds": 0.3, "steps": 3}
    done = run(venv, "taskport", "submit", "demo.sleep", "--payload", json.dumps(payload), "--wait", "--json",
               cwd=tmp_path, url=stack.base_url)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{stack.log_tails()}"
    waited = json.loads(done.stdout)
    assert waited["status"] == "COMPLETED"

    fetched = run(venv, "taskport", "result", waited["task_id"], "--json", cwd=tmp_path, url=stack.base_url)
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout) == waited
    assert waited["result"]["slept"] == payload["seconds"]


def test_the_client_imports_nothing_of_the_service(venv: Path, tmp_path: Path) -> None:
    done = run(venv, "python", "-X", "importtime", "-c", "import taskport, taskport.cli, taskport.client", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # importtime's lines: "import time: self [us] | cumulative | imported package", one per module imported
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"taskport.cli", "taskport.client", "httpx"} <= imported  # the output was read at all
    assert sorted(m for m in imported if m.partition(".")[0] in SERVICE_MODULES) == []


def test_the_venv_holds_the_client_and_its_three_dependencies_only(venv: Path, tmp_path: Path) -> None:
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    top = {path.name for path in site.iterdir()}
    assert "taskport" in top and not top & {"app", "workers"}
    code = "import importlib.metadata as m, json; print(json.dumps(m.requires('taskport-client')))"
    done = run(venv, "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(Requirement(line).name for line in json.loads(done.stdout)) == ["httpx", "httpx-sse", "rich"]


def test_the_clients_taskport_command_has_the_client_commands_only(venv: Path, tmp_path: Path) -> None:
    done = run(venv, "taskport", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^    (\w+)", done.stdout, re.MULTILINE))  # argparse's lines of COMMAND
    assert listed == set(COMMANDS)  # none of the service's (up, web, worker...): it is not installed here


def test_beside_the_service_the_same_command_runs_the_services_cli(tmp_path: Path) -> None:
    """The one ``taskport`` script (the client distribution's) finds the service's CLI by its entry point."""
    done = subprocess.run([str(Path(sys.executable).parent / "taskport"), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^    (\w+)", done.stdout, re.MULTILINE))
    assert {"up", "web", "worker", "scheduler", "deliverer", "config"} | set(COMMANDS) <= listed
