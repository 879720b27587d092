"""The pytest plugin of `make test-docs`: the pages run against real `taskport up` stacks, as a reader runs them.

`make test-docs` loads it (``-p tests.docs.plugin``) and names the pages in reading order; pytest keeps that
order. Each page gets one shell (``tests/docs/shell.py``) for all its examples, in one reader's directory
shared by the pages, where the ``<!-- file: ... -->`` blocks of every page are written first
(``tests/docs/pages.py``). The stacks are ``taskport up`` runs on free ports in temp data dirs (the
harness's ``Up``, as ``up_factory`` starts them):

- ``docs_stack`` for the walkthrough and README: a plain `make up`, plus a callback secret for the member
  ``public`` and ``TASKPORT_CALLBACK_ALLOW_HOSTS=127.0.0.1``, so a receiver on loopback can be called back (the
  walkthrough says so where it starts one);
- ``clients_stack`` for the clients page: the same, and ``TASKPORT_CORS_ORIGINS`` listing the frontend origin of
  its "A frontend on its own origin" (``FRONTEND_ORIGIN``: it says so);
- ``processors_stack`` for the processor guide, started as that page says: ``PYTHONPATH=$PWD/src
  TASKPORT_PROCESSORS=mypkg.tasks``, with the guide's own module written to ``src/mypkg/tasks.py``.

A page's shell has the venv's ``bin`` first on ``PATH`` (``taskport``, ``python3`` with the client,
``flask``), ``TASKPORT_URL`` set to its stack (the pages' ``$API`` defaults to it, as the clients do),
``TASKPORT_WEBHOOK_SECRET`` (the receiver's secret, the one the stack signs with), a UTF-8 locale and
``COLUMNS`` (the width a terminal gives rich for the CLI's tables and bar).
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil

from app.core.config import without_settings
from tests.docs.pages import PageParser, write_files
from tests.docs.shell import Shell, ShellTimeout
from tests.integration.harness import Up

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each page and the stack it runs against, in the order `make test-docs` names them.
PAGES = {"docs/walkthrough.md": "docs_stack", "docs/clients.md": "clients_stack",
         "docs/processors.md": "processors_stack", "README.md": "docs_stack"}
BLOCK_TIMEOUT = 150.0  # the longest block waits for a once-a-minute schedule to fire
COLUMNS = "150"
FRONTEND_ORIGIN = "http://localhost:3000"  # the origin of docs/clients.md's "A frontend on its own origin"
START_TIMEOUT = 90.0


@dataclass
class DocStack:
    """A running ``taskport up`` and what a page's shell needs to reach it."""

    up: Up
    reader_dir: Path
    secret: str

    def shell_env(self) -> dict[str, str]:
        env = {k: v for k, v in without_settings(os.environ).items() if k != "TASKPORT_API_KEY"}
        return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "TASKPORT_URL": self.up.base_url, "TASKPORT_WEBHOOK_SECRET": self.secret,
                "LC_ALL": "C.UTF-8", "COLUMNS": COLUMNS}


def _start(reader_dir: Path, name: str, **env: str) -> Iterator[DocStack]:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    workdir = reader_dir.parent / name
    workdir.mkdir()
    up = Up(workdir, TASKPORT_CALLBACK_SECRETS=f"public:{secret}", TASKPORT_CALLBACK_ALLOW_HOSTS="127.0.0.1", **env)
    try:
        up.wait_for("taskport is up", timeout=START_TIMEOUT)
        yield DocStack(up, reader_dir, secret)
    finally:
        up.kill_everything()


@pytest.fixture(scope="session")
def reader_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's directory: where the pages' commands run and their files are saved."""
    directory = tmp_path_factory.mktemp("docs") / "reader"
    directory.mkdir()
    write_files([REPO_ROOT / page for page in PAGES], directory)
    return directory


@pytest.fixture(scope="session")
def docs_stack(reader_dir: Path) -> Iterator[DocStack]:
    yield from _start(reader_dir, "docs-stack")


@pytest.fixture(scope="session")
def clients_stack(reader_dir: Path) -> Iterator[DocStack]:
    """docs/clients.md's: as the docs' own, with TASKPORT_CORS_ORIGINS listing its frontend's origin (the
    walkthrough shows the headers of the default configuration, which has no CORS)."""
    yield from _start(reader_dir, "clients-stack", TASKPORT_CORS_ORIGINS=FRONTEND_ORIGIN)


@pytest.fixture(scope="session")
def processors_stack(reader_dir: Path) -> Iterator[DocStack]:
    yield from _start(reader_dir, "processors-stack", PYTHONPATH=str(reader_dir / "src"),
                      TASKPORT_PROCESSORS="mypkg.tasks")


def _stack(namespace: dict[str, Any]) -> DocStack:
    return next(value for value in namespace.values() if isinstance(value, DocStack))


def run_in_page(namespace: dict[str, Any], source: str, timeout: float) -> str:
    """Run ``source`` in the page's shell, started at its first example."""
    stack = _stack(namespace)
    if "shell" not in namespace:
        namespace["shell"] = Shell(stack.reader_dir, stack.shell_env())
    try:
        return str(namespace["shell"].run(source, timeout))
    except ShellTimeout as exc:
        raise ShellTimeout(f"{exc}\nthe stack's log ends with:\n{stack.up.tail(40)}") from None


def _close_shell(namespace: dict[str, Any]) -> None:
    shell = namespace.pop("shell", None)
    if shell is not None:
        shell.close()


SYBILS = {page: Sybil([PageParser(run_in_page, BLOCK_TIMEOUT)], path=str(REPO_ROOT), patterns=[page],
                      fixtures=[stack], teardown=_close_shell)
          for page, stack in PAGES.items()}
_COLLECTORS: dict[str, Callable[..., Any]] = {page: sybil.pytest() for page, sybil in SYBILS.items()}


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    """The pages of PAGES (by their exact path: README.md is not tests/README.md) as Sybil's test files."""
    try:
        page = file_path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return None
    collect = _COLLECTORS.get(page)
    return collect(file_path, parent) if collect else None
