"""The process toolkit (app/core/process.py): liveness, ending a process or a session, ports, pidfiles."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from app.core.config import LOOPBACK
from app.core.process import alive, free_port, kill_session, port_in_use, read_pid, session_members, terminate

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_free_port_is_free_until_someone_listens_on_it():
    port = free_port()
    assert not port_in_use(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, port))
        s.listen()
        assert port_in_use(port)


def test_read_pid_reads_a_number_and_nothing_else(tmp_path: Path):
    (tmp_path / "good.pid").write_text("4242\n")
    (tmp_path / "bad.pid").write_text("not a pid")
    assert read_pid(tmp_path / "good.pid") == 4242
    assert read_pid(tmp_path / "bad.pid") is None and read_pid(tmp_path / "missing.pid") is None


def test_a_zombie_is_not_alive_and_a_reaped_child_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)
    assert alive(os.getpid())


def test_terminate_ends_a_process_that_is_not_our_child_to_wait_for():
    child = subprocess.Popen(SLEEPER)
    try:
        terminate(child.pid, timeout=5)
        assert child.wait(timeout=5) == -15  # SIGTERM was enough
    finally:
        child.kill()
        child.wait()


def test_kill_session_ends_every_member_of_the_session():
    starts_a_child = ("import subprocess, sys, time; "
                      f"subprocess.Popen({SLEEPER!r}); print('up', flush=True); time.sleep(60)")
    with subprocess.Popen([sys.executable, "-c", starts_a_child], stdout=subprocess.PIPE,
                          start_new_session=True) as leader:
        try:
            assert leader.stdout is not None and leader.stdout.readline() == b"up\n"
            members = session_members(leader.pid)
            assert leader.pid in members and len(members) == 2  # the leader and the child it started
            kill_session(leader.pid)
            leader.wait(timeout=5)
            assert session_members(leader.pid) == []
        finally:
            leader.kill()
