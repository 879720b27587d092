"""The bed itself (tests/scale/bed.py): replication, isolation, partitions, failover, and a teardown that
leaves nothing behind, also when ``python -m tests.scale.bed up`` is interrupted or killed."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.process import alive
from tests.integration.harness import wait_until
from tests.scale.bed import (
    DATA_NODES,
    IP,
    LOCK_DIR,
    REDIS_PORT,
    REPO_ROOT,
    SENTINELS,
    SUBNET,
    Bed,
    BedError,
    RemoteError,
    clean,
    netns_names,
    netns_pids,
)

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()"


def _root_links() -> str:
    return subprocess.run([IP, "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def _root_addrs() -> str:
    return subprocess.run([IP, "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout


def _follows(bed: Bed, host: str, primary: str) -> bool:
    info = bed.redis(host).info()
    return (info.get("role"), info.get("master_host"), info.get("master_link_status")) == (
        "slave", bed.hosts[primary].ip, "up")


def _bed_pids(tag: str) -> list[int]:
    return [pid for ns in netns_names() if ns.startswith(f"{tag}-") for pid in netns_pids(ns)]


def _assert_nothing_left(tag: str, pids: list[int]) -> None:
    assert not [ns for ns in netns_names() if ns.startswith(f"{tag}-")]
    assert tag not in _root_links()
    assert not [pid for pid in pids if alive(pid)]
    assert not (LOCK_DIR / f"{tag}.lock").exists()


def test_replicas_replicate_and_sentinels_agree(bed: Bed) -> None:
    primary = bed.primary()
    assert primary == "redis1"
    assert bed.redis(primary)("SET", "bed:replicated", "yes") is True
    assert bed.redis(primary)("WAIT", 2, 2000) == 2
    for replica in (name for name in DATA_NODES if name != primary):
        assert bed.redis(replica)("GET", "bed:replicated") == "yes"
        with pytest.raises(RemoteError, match="read only replica"):
            bed.redis(replica)("SET", "bed:replicated", "no")
    for sentinel in SENTINELS:
        assert bed.sentinel_master(sentinel)["ip"] == bed.hosts[primary].ip
    assert bed.sentinel_env()["REDIS_SENTINELS"].count(":26379") == 3


def test_the_root_namespace_gets_no_interface(bed: Bed) -> None:
    assert bed.tag is not None and bed.tag not in _root_links()
    assert f"{SUBNET}." not in _root_addrs()


def test_a_cut_host_is_unreachable_until_healed(bed: Bed) -> None:
    replica = "redis3"
    assert bed.reachable(replica)
    bed.cut(replica)
    started = time.monotonic()
    assert not bed.reachable(replica, timeout=0.5)
    assert time.monotonic() - started < 2.0
    inside = bed.run(replica, [sys.executable, "-c", CONNECT, bed.hosts["redis1"].ip, str(REDIS_PORT)], timeout=10)
    assert inside.returncode != 0 and "unreachable" in inside.stderr
    bed.heal(replica)
    wait_until(lambda: bed.reachable(replica, timeout=0.5), timeout=10, message="the healed host reachable")
    wait_until(lambda: _follows(bed, replica, "redis1"), timeout=20, ignore=(RemoteError,),
               message="the healed replica back in sync")


def test_a_killed_primary_is_replaced_and_rejoins_as_a_replica(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    old = bed.primary()

    def promoted_one() -> str | None:
        found = bed.primary()
        return found if found != old else None

    assert bed.redis(old)("SET", "bed:before-failover", "kept") is True
    assert bed.redis(old)("WAIT", 2, 2000) == 2
    started = time.monotonic()
    bed.kill_host(old)
    assert not bed.servers[old].alive()
    new = wait_until(promoted_one, timeout=30, ignore=(BedError,),
                     message=lambda: f"a new primary\n{bed.log_tails(15)}")
    promoted = time.monotonic() - started
    assert bed.redis(new).info()["role"] == "master"
    assert bed.redis(new)("GET", "bed:before-failover") == "kept"
    other = next(name for name in DATA_NODES if name not in (old, new))
    wait_until(lambda: _follows(bed, other, new), timeout=20, ignore=(RemoteError,), message="the other replica")
    restarted = time.monotonic()
    bed.restart_redis(old)
    wait_until(lambda: _follows(bed, old, new), timeout=40, ignore=(RemoteError,),
               message=lambda: f"{old} rejoining as a replica\n{bed.log_tails(15)}")
    rejoined = time.monotonic() - restarted
    assert bed.primary() == new
    with capsys.disabled():
        print(f"\n[bed] kill -9 of {old}: {new} promoted after {promoted:.2f} s; "
              f"{old} restarted and replicating {new} after {rejoined:.2f} s")


def test_close_leaves_no_namespace_link_or_process(tmp_path: Path) -> None:
    with Bed(tmp_path) as made:
        made.start_redis()
        assert made.tag is not None
        tag = made.tag
        made.start_role("web1", "web", env={"TASKPORT_HOST": made.hosts["web1"].ip} | made.sentinel_env())
        sleeper = made.spawn("work1", ["sleep", "600"], name="sleeper")
        echo = made.spawn("work2", ["/bin/sh", "-c", "echo started; exec sleep 600"], name="echo")
        wait_until(lambda: "started" in echo.tail(1), timeout=10, message="the echo's output in its log")
        assert echo.stop(grace=5) == -signal.SIGTERM and not echo.alive()
        pids = _bed_pids(tag)
        assert len(pids) >= 8 and sleeper.pid in pids  # 6 servers, the client helper, the web, the sleeper
    _assert_nothing_left(tag, pids)
    assert not sleeper.alive()


def _await_ready(up: subprocess.Popen[str], timeout: float) -> str:
    """The output of ``bed up`` until its "ready" line."""
    assert up.stdout is not None
    out = ""
    deadline = time.monotonic() + timeout
    while "ready:" not in out:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or up.poll() is not None:
            raise AssertionError(f"bed up not ready (exit {up.poll()}):\n{out}")
        if select.select([up.stdout], [], [], remaining)[0]:
            out += os.read(up.stdout.fileno(), 1 << 16).decode()
    return out


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_an_interrupted_up_leaves_nothing(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    tag = f"tp{os.getpid()}s{int(sig)}"
    argv = [sys.executable, "-m", "tests.scale.bed", "up", "--workdir", str(tmp_path), "--tag", tag]
    with subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as up:
        try:
            out = _await_ready(up, timeout=40)
            assert "REDIS_SENTINELS=" in out and "redis1" in out
            pids = _bed_pids(tag)
            assert len(pids) >= 7
            os.kill(up.pid, sig)
            assert up.wait(timeout=30) == code
            if sig == signal.SIGKILL:  # nothing could run: the leftovers are clean()'s
                assert _bed_pids(tag)
                assert clean(tag) == [tag]
            _assert_nothing_left(tag, pids)
        finally:
            if up.poll() is None:
                up.kill()
            clean(tag)
