"""The bed's helper in the ``client`` host: Redis commands against the bed's servers are sent from inside
the bed, through one long-lived process (redis-py over stdin/stdout), so polling a condition costs a round
trip, not a Python start (issue 19, part 5; the bed itself is ``bed.py``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.process import kill_session
from tests.scale.netns import IP, BedError


class RemoteError(BedError):
    """A command run from inside the bed failed (connection refused or timed out, a Redis error...)."""


# The helper in ``client``: one JSON request per line on stdin, one JSON reply per line on stdout.
AGENT = r"""
import json, socket, sys
import redis
def serve(req):
    if req["op"] == "connect":
        socket.create_connection((req["ip"], req["port"]), timeout=req["timeout"]).close()
        return True
    with redis.Redis(req["ip"], req["port"], socket_timeout=req["timeout"], decode_responses=True,
                     socket_connect_timeout=req["timeout"]) as conn:
        return conn.execute_command(*req["args"])
for line in iter(sys.stdin.readline, ""):
    try:
        reply = {"ok": serve(json.loads(line))}
    except Exception as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(reply, default=str) + "\n")
    sys.stdout.flush()
"""


class Agent:
    """The long-lived helper process in namespace ``ns`` (started on first use, again if it died), run with
    ``env()`` in ``cwd``, its stderr appended to ``log``."""

    def __init__(self, ns: str, *, log: Path, env: Callable[[], dict[str, str]], cwd: Path) -> None:
        self.ns = ns
        self.log = log
        self.env = env
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.buffer = b""

    def request(self, payload: dict[str, Any], timeout: float) -> Any:
        """One request, its reply's ``ok`` value; RemoteError for the helper's error, BedError if it died
        or did not answer within ``timeout`` + 5 s (then it is killed, and the next request starts it again)."""
        with self.lock:
            popen = self._running()
            assert popen.stdin is not None and popen.stdout is not None
            popen.stdin.write(json.dumps(payload).encode() + b"\n")
            popen.stdin.flush()
            deadline = time.monotonic() + timeout + 5.0
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([popen.stdout], [], [], remaining)[0]:
                    self.close()
                    raise BedError(f"the client helper did not answer {payload}")
                chunk = os.read(popen.stdout.fileno(), 1 << 16)
                if not chunk:
                    self.close()
                    raise BedError(f"the client helper died: {self.log.read_text()}")
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\n")
        reply = json.loads(line)
        if "error" in reply:
            raise RemoteError(reply["error"])
        return reply["ok"]

    def _running(self) -> subprocess.Popen[bytes]:
        if self.popen is None or self.popen.poll() is not None:
            with open(self.log, "ab") as log:
                self.popen = subprocess.Popen(
                    [IP, "netns", "exec", self.ns, sys.executable, "-c", AGENT],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self.env(),
                    cwd=self.cwd, start_new_session=True)
            self.buffer = b""
        return self.popen

    def close(self) -> None:
        if self.popen is not None:
            kill_session(self.popen.pid)
            self.popen.wait()
            for pipe in (self.popen.stdin, self.popen.stdout):
                if pipe is not None:
                    pipe.close()
            self.popen = None


@dataclass
class Remote:
    """Redis commands on one server of the bed, sent from the client host; replies decoded."""

    agent: Agent
    ip: str
    port: int

    def __call__(self, *args: str | int | float, timeout: float = 2.0) -> Any:
        payload = {"op": "redis", "ip": self.ip, "port": self.port, "args": list(args), "timeout": timeout}
        return self.agent.request(payload, timeout)

    def info(self, section: str = "replication", timeout: float = 2.0) -> dict[str, Any]:
        """INFO parsed by redis-py (``role``, ``master_link_status``, ``connected_slaves``...)."""
        return dict(self("INFO", section, timeout=timeout))
