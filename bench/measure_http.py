"""HTTP measurements: each runs ``bench.loadgen`` in its own process against the running gunicorn.

Also the load generator's own ceiling: the same generator against ``bench.canned`` (a server that does
nothing per request), so the report can show the generator pushes far more than gunicorn serves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import redis

from app import keys
from app.embedded import free_port, port_in_use
from bench.apps import GET_KEY, GET_VALUE
from bench.counting import command_delta, commandstats, per_op
from bench.stack import REPO, Stack


def loadgen(port: int, kind: str, *, conns: int, warmup: float, duration: float, ids_file: str | None = None,
            base: int = 0, env: dict[str, str] | None = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--kind", kind, "--conns", str(conns),
            "--warmup", str(warmup), "--duration", str(duration), "--base", str(base)]
    if ids_file:
        argv += ["--ids", ids_file]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=warmup + duration + 60,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {kind} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise RuntimeError(f"loadgen {kind}: unexpected statuses {result['errors']}")
    return result


def with_commands(conn: redis.Redis, run: Any) -> dict[str, Any]:
    """Run a loadgen measurement and add the Redis commands per request (INFO commandstats delta over
    every request sent, warm-up included, since the server counts those too)."""
    before = commandstats(conn)
    result: dict[str, Any] = run()
    delta = command_delta(before, commandstats(conn))
    result["commands_per_request"] = per_op(delta, max(int(result["submitted_total"]), 1))
    return result


def loadgen_ceiling(stack: Stack, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.canned", str(port)], cwd=REPO, env=stack.environ(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_in_use(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the canned server did not start")
            time.sleep(0.05)
        return loadgen(port, "canned", conns=conns, warmup=warmup, duration=duration, env=stack.environ())
    finally:
        server.terminate()
        server.wait(10)


def http_phases(stack: Stack, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    """hello, submit (no worker runs: they are not started yet), one GET, status reads of the submitted
    tasks. Baseline and measured run back to back."""
    conn = stack.client()
    conn.set(GET_KEY, GET_VALUE)
    env = stack.environ()
    port = stack.config.port
    out: dict[str, Any] = {}
    out["hello"] = with_commands(conn, lambda: loadgen(port, "hello", conns=conns, warmup=warmup,
                                                       duration=duration, env=env))
    out["submit"] = with_commands(conn, lambda: loadgen(port, "submit", conns=conns, warmup=warmup,
                                                        duration=duration, base=0, env=env))
    ids = [m.decode() for m in conn.zrange(keys.history("public"), 0, 19_999)]
    ids_file = stack.dir / "task-ids.txt"
    ids_file.write_text("\n".join(ids))
    out["get"] = with_commands(conn, lambda: loadgen(port, "get", conns=conns, warmup=warmup, duration=duration,
                                                     env=env))
    out["status"] = with_commands(conn, lambda: loadgen(port, "status", conns=conns, warmup=warmup,
                                                        duration=duration, ids_file=str(ids_file), env=env))
    out["status"]["distinct_tasks_read"] = len(ids)
    conn.close()
    return out
