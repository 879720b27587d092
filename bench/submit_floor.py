"""Where a submit's CPU goes, and the best submit/hello ratio any submit that makes its one Redis round trip
could reach on this stack (``make bench`` does not run this; bench/README.md "Submit floor" reads it).

    .venv/bin/python bench/submit_floor.py            # ~1 minute

1. Over HTTP, the bench stack (embedded Redis, gunicorn exactly as ``taskport web`` runs it): CPU per request
   of the web processes and of redis-server (``/proc/<pid>/stat``) while ``bench.loadgen`` drives GET
   /bench/hello, then POST /api/v1/tasks; an RQ worker is registered and takes nothing (as in ``make bench``).
2. In-process, the same app's WSGI callable called directly under gevent, against that redis-server:
   CPU per submit whole, with its one script not sent (the store answers as if created: what taskport
   itself spends), and the script alone with a submit's own keys and arguments, through taskport's client.

The floor is then: hello's web CPU + the script's client CPU + redis-server's CPU per submit, the cost of a
submit that did nothing but its one round trip; the best ratio is hello's cost over that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from bench import measure_http  # noqa: E402
from bench.stack import REPO, Stack  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")

CHILD = r"""
import io, json, sys, time
from gevent import monkey
monkey.patch_all()
import redis
from app.web import create_app
from app.core.config import Config
from app.core.jobs import Worker
from app.core.states import QUEUES
from app.core.store import TaskStore

url, n = sys.argv[1], int(sys.argv[2])
app = create_app(Config.from_env({"REDIS_URL": url}))
Worker(list(QUEUES), connection=redis.Redis.from_url(url)).register_birth()  # a worker listens, as in production
app.add_url_rule("/_floor/hello", "floor_hello", lambda: "hello")
base = {"SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1:8000", "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.errors": sys.stderr, "QUERY_STRING": ""}
count = iter(range(10**9))
def submit():
    body = json.dumps({"type": "demo.sleep", "payload": {"seconds": next(count) * 1e-9}}).encode()
    env = dict(base, REQUEST_METHOD="POST", PATH_INFO="/api/v1/tasks", CONTENT_TYPE="application/json",
               CONTENT_LENGTH=str(len(body)), **{"wsgi.input": io.BytesIO(body)})
    return b"".join(app(env, lambda *a: None))
def hello():
    env = dict(base, REQUEST_METHOD="GET", PATH_INFO="/_floor/hello", **{"wsgi.input": io.BytesIO(b"")})
    return b"".join(app(env, lambda *a: None))
def cpu(fn, rounds=3):
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best
for _ in range(200):
    submit()
out = {"hello": cpu(hello), "submit": cpu(submit)}
real = TaskStore.run_script
calls = []
def recording(self, name, keys, args, client=None):
    calls.append((self, name, keys, args))
    return [1] if name == "submit" else real(self, name, keys, args, client)
TaskStore.run_script = recording
out["submit without its script"] = cpu(submit)
store, name, keys, args = calls[-1]
TaskStore.run_script = real
ids = iter(range(10**9))
def script_alone():  # the same script and arguments, each run on fresh keys (so nothing is a duplicate)
    i = next(ids)
    fresh = [f"{k}:{i}" for k in keys]
    real(store, name, fresh, args)
out["the submit script alone"] = cpu(script_alone)
out["arguments per script"] = len(keys) + len(args) + 1  # + the audit stream's key, which run_script appends
print(json.dumps(out))
"""


def _cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    return out


def _children(ppid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return found


def over_http(stack: Stack, duration: float) -> dict[str, Any]:
    assert stack.web is not None
    webs = _children(stack.web.pid)
    redis_pid = stack.redis_server.server_pid()
    assert redis_pid is not None
    out: dict[str, Any] = {"web processes": len(webs)}
    with measure_http.listening_worker(stack.client()):
        for kind in ("hello", "submit"):
            before = _cpu([*webs, redis_pid])
            result = measure_http.loadgen(stack.config.port, kind, conns=16, warmup=1.0, duration=duration,
                                          env=stack.environ())
            after = _cpu([*webs, redis_pid])
            n = int(result["submitted_total"])  # every request sent, warm-up included, like the CPU deltas
            out[kind] = {"req/s": round(result["rps"]),
                         "web µs/request": sum(after[p] - before[p] for p in webs) / n * 1e6,
                         "redis-server µs/request": (after[redis_pid] - before[redis_pid]) / n * 1e6}
    return out


def in_process(stack: Stack, requests: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKPORT_", "REDIS_"))}
    done = subprocess.run([sys.executable, "-c", CHILD, str(stack.config.redis_url), str(requests)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    with Stack() as stack:
        stack.start()
        stack.start_web()
        http = over_http(stack, duration)
        local = in_process(stack, 2000)
    hello, submit = http["hello"], http["submit"]
    print(f"over HTTP ({http['web processes']} web processes, 16 connections, {duration:g} s windows):")
    for kind in ("hello", "submit"):
        row = http[kind]
        print(f"  {kind:7} {row['req/s']:6,} req/s   web {row['web µs/request']:5.0f} µs/request   "
              f"redis-server {row['redis-server µs/request']:4.0f} µs/request")
    print(f"  submit/hello: {submit['req/s'] / hello['req/s']:.2f}x")
    print("in-process, µs of CPU per request (best of 3 rounds of 2,000):")
    for key, value in local.items():
        print(f"  {key:28} {value:6.0f}")
    script = local["the submit script alone"] + submit["redis-server µs/request"]
    floor = hello["web µs/request"] + script
    print(f"a submit that only made its round trip: hello's {hello['web µs/request']:.0f} + the script's "
          f"{local['the submit script alone']:.0f} (client) + {submit['redis-server µs/request']:.0f} (redis-server) "
          f"= {floor:.0f} µs, so at best {hello['web µs/request'] / floor:.2f}x hello")
    own = local["submit without its script"] - local["hello"]
    print(f"taskport's own work per submit beyond hello (parse, validate, ids, log, render): {own:.0f} µs")


if __name__ == "__main__":
    main()
