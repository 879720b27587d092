"""The bed's toolkit of namespaces, links and processes (``ip netns``), and the names and locks that make a
teardown leave nothing behind (issue 19, part 5; the bed itself is ``bed.py``).

Every name a bed creates carries its tag (``tp<pid><letter>``): namespaces ``<tag>-<host>``, links
``<tag>h<octet>`` (host end) and ``<tag>b<octet>`` (switch end), bridge ``<tag>br``. A bed holds a lock
(``LOCK_DIR/<tag>.lock``) for its life, so ``clean()`` removes what a killed run left behind but never
a live bed of another process.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The bed's hosts: the host part of every namespace name a bed makes, so they live with the naming rule.
HOSTS: dict[str, int] = {  # host name -> last octet of its IP
    "redis1": 11, "redis2": 12, "redis3": 13,
    "sent1": 21, "sent2": 22, "sent3": 23,
    "web1": 31, "web2": 32, "work1": 41, "work2": 42,
    "client": 51,
}
SWITCH = "switch"  # the namespace holding the bridge
TAG_PREFIX = "tp"
TAG_PATTERN = re.compile(r"[a-z][a-z0-9]{1,10}")  # <= 11 chars: "<tag>h51" fits IFNAMSIZ (15)
LOCK_DIR = Path("/run/taskport-bed")
IP = "/usr/sbin/ip"
KILL_TIMEOUT = 10.0
NETNS_DIR = Path("/run/netns")  # where `ip netns add` names a namespace
CLONE_NEWNET = 0x40000000
MADE: list[str] = []  # the tag of every bed this process built, for a final check that none is left


class BedError(RuntimeError):
    """The bed could not be built, a server did not come up, or the Sentinels do not agree."""


def _ip(*args: str, ns: str | None = None, batch: str | None = None) -> str:
    argv = [IP, *(("-n", ns) if ns else ()), *(("-b", "-") if batch is not None else ()), *args]
    done = subprocess.run(argv, input=batch, capture_output=True, text=True, check=False)
    if done.returncode:
        raise BedError(f"{' '.join(argv)}: {done.stderr.strip()}\n{batch or ''}")
    return done.stdout


def netns_names() -> list[str]:
    """Every network namespace ``ip netns`` knows."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    """Live processes in namespace ``ns`` (zombies hold no namespace, so they are not listed)."""
    done = subprocess.run([IP, "netns", "pids", ns], capture_output=True, text=True, check=False)
    return [int(pid) for pid in done.stdout.split()]


def kill_all(namespaces: list[str]) -> None:
    """SIGKILL every process in ``namespaces`` until none is left (a fork racing the kill included)."""
    deadline = time.monotonic() + KILL_TIMEOUT
    while pids := [pid for ns in namespaces for pid in netns_pids(ns)]:
        if time.monotonic() > deadline:
            raise BedError(f"processes in {namespaces} do not die: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _tag_of(ns: str) -> str | None:
    tag, _, host = ns.partition("-")
    return tag if (host in HOSTS or host == SWITCH) and TAG_PATTERN.fullmatch(tag) else None


def destroy(tag: str) -> None:
    """Kill every process in the tag's namespaces, then delete them (their veths and bridge go with them)."""
    names = [ns for ns in netns_names() if _tag_of(ns) == tag]
    kill_all(names)
    for ns in names:
        _ip("netns", "del", ns)
    for line in _ip("-o", "link", "show").splitlines():  # none is ever made here: a guard, not a step
        name = line.split(": ")[1].split("@")[0]
        if re.fullmatch(rf"{tag}(h\d+|b\d+|br)", name):
            _ip("link", "del", name)


def _lock(tag: str) -> int | None:
    """The tag's lock fd, or None when a live bed holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{tag}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(tag: str, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (LOCK_DIR / f"{tag}.lock").unlink()
    os.close(fd)


def clean(tag_prefix: str = TAG_PREFIX) -> list[str]:
    """Remove every namespace, link and process of the beds whose tag starts with ``tag_prefix`` and
    whose owner is gone (a killed run); a live bed (its lock held) is left alone. Returns the tags removed."""
    tags = {tag for ns in netns_names() if (tag := _tag_of(ns))}
    if LOCK_DIR.is_dir():
        tags |= {path.stem for path in LOCK_DIR.glob("*.lock")}
    removed = []
    for tag in sorted(t for t in tags if t.startswith(tag_prefix)):
        fd = _lock(tag)
        if fd is not None:
            try:
                destroy(tag)
            finally:
                _unlock(tag, fd)
            removed.append(tag)
    return removed


def run_inside(ns: str, target: Callable[[], Any]) -> Any:
    """``target()`` in a thread of this process moved into namespace ``ns``: its sockets, and those of every
    thread it starts, are the host's (setns(2) moves one thread, and a thread inherits its creator's). The
    calling thread stays where it is, so a teardown's ``kill_all`` of ``ns`` never finds this process."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                outcome["error"] = OSError(ctypes.get_errno(), f"setns into {ns}")
                return
        finally:
            os.close(fd)
        try:
            outcome["value"] = target()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=body, name=f"in-{ns}", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
