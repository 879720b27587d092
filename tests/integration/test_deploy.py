"""The Heroku-style deploy, as a buildpack does it: a fresh venv installed only from requirements.txt (the
lock file), the project on top without dependencies, then the Procfile run by honcho against a real Redis.
A task submitted over HTTP completes. Slow-ish (a venv and ~30 packages from the pip cache), so one test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from app.core.config import without_settings
from app.core.process import free_port, kill_session
from tests.integration.harness import REPO_ROOT, Api, RedisServer, wait_until

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

SLUG_FILES = ("app", "workers", "clients", "Procfile", "pyproject.toml", "README.md", "requirements.txt",
              ".python-version")
BUILD_BACKEND = "setuptools>=70.1"  # pyproject.toml's [build-system]: 70.1 builds wheels without `wheel`
INSTALL_TIMEOUT = 300  # seconds: creating the venv and installing from the pip cache takes ~30 s here


def run(args: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def lock_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with nothing but what requirements.txt pins, plus the project itself (``--no-deps``)."""
    root = tmp_path_factory.mktemp("deploy")
    slug = root / "slug"  # what a buildpack gets: the repository's files
    for name in SLUG_FILES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, slug / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            slug.mkdir(exist_ok=True)
            shutil.copy2(source, slug / name)
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    run([*pip, "--requirement", "requirements.txt"], cwd=slug)  # from the slug, as its `-e clients/python` reads
    # the build backend, as a Python buildpack provides it (no runtime dependency brings setuptools along)
    run([*pip, BUILD_BACKEND])
    run([*pip, "--no-deps", "--no-build-isolation", str(slug)])
    return venv


@pytest.fixture
def honcho(lock_venv: Path, redis_conn: redis.Redis, redis_server: RedisServer, tmp_path: Path) -> Iterator[
        tuple[subprocess.Popen[bytes], str, Path]]:
    """``honcho start`` in the slug with the venv's bin on PATH (as on Heroku); yields (process, url, log)."""
    slug = lock_venv.parent / "slug"
    port = free_port()
    env = {k: v for k, v in without_settings(os.environ).items() if k != "VIRTUAL_ENV"}
    env.update({
        "PATH": f"{lock_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "REDIS_URL": redis_server.url,
        "PORT": str(port), "WEB_CONCURRENCY": "1", "TASKPORT_HOST": "127.0.0.1", "TASKPORT_DATA_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    })
    log = tmp_path / "honcho.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(lock_venv / "bin" / "honcho"), "start"], cwd=slug, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        kill_session(proc.pid)
        proc.wait()


@pytest.mark.timeout(INSTALL_TIMEOUT + 120)
def test_the_procfile_runs_from_a_venv_built_only_from_the_lock_file(
        honcho: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, url, log = honcho

    def up() -> bool:
        assert proc.poll() is None, f"honcho exited {proc.returncode}:\n{log.read_text(errors='replace')}"
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200

    wait_until(up, timeout=60, ignore=(requests.RequestException,), message=lambda: log.read_text(errors="replace"))
    with Api(url) as api:
        task_id = api.create("demo.sleep", {"seconds": 0.2, "steps": 2})
        doc = api.wait_for(task_id, "COMPLETED", timeout=30)
        assert doc["progress"] == 100
        ready = wait_until(lambda: (r := api.get("/readyz")).status_code == 200 and r.json(), timeout=30,
                           message=lambda: api.get("/readyz").text)
        assert ready["problems"] == []
    text = log.read_text(errors="replace")
    assert f"Listening at: http://127.0.0.1:{url.rsplit(':', 1)[1]}" in text, text
    assert "Traceback" not in text and "not found" not in text, text
