"""The walkthrough's section 12 starts its callback receiver as a reader's shell would run it: from the checkout,
with the service's venv not on PATH (a bare ``flask`` was whatever the machine had, often none, or one without
standardwebhooks). A real bash, the page's own block, and the receiver of docs/clients.md."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.docs.pages import blocks, write_files
from tests.integration.harness import REPO_ROOT

VENV_BIN = Path(sys.executable).parent


def test_section_12_starts_its_receiver_without_the_venv_on_path(tmp_path: Path) -> None:
    text = (REPO_ROOT / "docs" / "walkthrough.md").read_text()
    [start] = [b.source for b in blocks(text) if "--app receiver run" in b.source]
    write_files([REPO_ROOT / "docs" / "clients.md"], tmp_path)  # receiver.py, as the reader saved it
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)  # the checkout's venv, as `make up` built it
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    env = {**os.environ, "PATH": path, "TASKPORT_WEBHOOK_SECRET": "whsec_" + "A" * 44}
    env.pop("VIRTUAL_ENV", None)
    shell = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", start], cwd=tmp_path, env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # the receiver it starts with & stays in its session
    try:
        code = shell.wait(timeout=30)  # the block's own ``until curl ...`` ends once the receiver answers
    except subprocess.TimeoutExpired:
        code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        shell.wait()
    log = tmp_path / "receiver.log"
    assert code == 0, log.read_text() if log.exists() else "no receiver.log"
