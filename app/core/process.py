"""The process toolkit: children that die with their parent, liveness, ending a process or a whole
session, free TCP ports. The worker and the scheduler use the first; the launcher (``taskport up``),
the embedded Redis, the web command and the tests use the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from pathlib import Path

from app.core.config import LOOPBACK

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
_forking_parent: int | None = None  # set just before a fork, read by the child (see forked_children_die_with_me)


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent dies, even by SIGKILL, so no
    child (a work horse, the housekeeper) outlives the process that owns it. Elsewhere: nothing.

    ``parent``: the pid this process was started by. A parent that died before this call (while the
    child was still starting) would never send the signal, so then it is sent at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        if parent is not None and os.getppid() != parent:
            os.kill(os.getpid(), sig)


def forked_children_die_with_me(sig: int = signal.SIGTERM) -> None:
    """Every child this process forks from now on gets ``die_with_parent(sig)`` (RQ forks its scheduler and
    its work horses itself): a ``kill -9`` of the worker then leaves no orphan holding RQ's locks."""

    def before() -> None:
        global _forking_parent
        _forking_parent = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: die_with_parent(sig, _forking_parent))


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) != "Z"


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM a process that is not our child, wait for it to go, SIGKILL it after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.02)


def session_members(sid: int) -> list[int]:
    """Live (not zombie) pids in session ``sid`` (Linux; empty elsewhere). A child started with
    ``start_new_session`` leads its own session and everything it starts stays in it, even an RQ work
    horse that moves to its own process group: killing the session leaves no orphan behind."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid and alive(int(entry.name)):
                    members.append(int(entry.name))
    return members


def kill_session(sid: int, sig: int = signal.SIGKILL, timeout: float = 5.0) -> None:
    """Send ``sig`` to the session's leader group and to every other member of the session; with
    SIGKILL, wait (up to ``timeout`` s) until none of them is alive any more."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while sig == signal.SIGKILL and session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _proc_state(pid: int) -> str | None:
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]
    return None
