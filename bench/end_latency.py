"""How soon a task's COMPLETED is seen after its processor returned, before and after, in the same run.

Issue 32's end on the next claim's pipeline (bench/README.md) must not make a completed task wait: this measures,
per task, the wall time from the processor's return (in the worker) to the moment a watcher in another process
receives the task's COMPLETED event (the PUBLISH that TRANSITION sends in the same atomic step as the status:
what a watcher, SSE or wait, is told). Both clocks are ``time.perf_counter`` (CLOCK_MONOTONIC: one clock for every
process on the machine). Each tree (``git archive`` of two commits, as bench/delivery_ab.py) runs a child: ``n``
no-op tasks created and queued, an in-process simple worker in burst mode, its processor wrapped to note when it
returns, and a watcher process subscribed to every task's events. Rounds alternate (A B A B ...); the table gives
each round's median and 90th percentile and the median of the rounds.

    .venv/bin/python bench/end_latency.py --before main --rounds 3 --tasks 500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from app.core.config import without_settings  # noqa: E402
from bench.trees import alternate_children, table  # noqa: E402

# The watcher: every message on every task's events channel, with when it came, until "stop" on its own channel.
WATCHER = r"""
import json, sys, time
import redis
from app.core import keys
conn = redis.Redis.from_url(sys.argv[1])
sub = conn.pubsub()
sub.psubscribe(keys.events("*"))
sub.subscribe("end-latency-stop")
got = []
print("ready", flush=True)
for message in sub.listen():
    if message["type"] == "message":
        break
    if message["type"] == "pmessage":
        got.append((keys.events_task_id(message["channel"]), time.perf_counter()))
print(json.dumps(got))
"""

# Runs inside a tree; only APIs that both trees have.
CHILD = r"""
import dataclasses, json, statistics, subprocess, sys, tempfile, time
import redis
import app
from app.core import keys, processors
from app.core.config import Config
from app.core.states import QUEUES
from bench.fill import TASK_TYPE, create_tasks
from workers import runner as runner_module
from workers.worker import WORKER_CLASSES

url, n, watcher = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = Config.from_env({}, data_dir=tempfile.mkdtemp(prefix="end-latency-"), redis_url=url, api_keys="")
plain = redis.Redis.from_url(url, socket_timeout=30)
conn = redis.Redis.from_url(url, socket_timeout=30)
runner_module.use(runner_module.Runner(config, conn))
returned = {}


def burst(fill):
    plain.flushall()
    if fill:
        create_tasks(plain, config, fill, enqueue=True, base=80_000_000)
    WORKER_CLASSES["simple"](list(QUEUES), connection=conn).work(burst=True, logging_level="WARNING")


burst(20)  # imports, connections, scripts loaded
proc = processors.get(TASK_TYPE)
func = proc.func


def timed(payload, ctx):
    out = func(payload, ctx)
    returned[ctx.task_id] = time.perf_counter()
    return out


processors._REGISTRY[TASK_TYPE] = dataclasses.replace(proc, func=timed)
watch = subprocess.Popen([sys.executable, "-c", watcher, url], stdout=subprocess.PIPE, text=True)
assert watch.stdout.readline().strip() == "ready"
burst(n)
plain.publish("end-latency-stop", "1")
seen = json.loads(watch.communicate(timeout=120)[0].strip().splitlines()[-1])
done = int(plain.hget(keys.STATS, "completed") or 0)
assert done == n, f"{done} of {n} tasks COMPLETED"
first_after = {}
for task_id, at in seen:  # the first event after the return: the COMPLETED one (START's came before it)
    if task_id in returned and at >= returned[task_id] and task_id not in first_after:
        first_after[task_id] = at
lags = sorted((first_after[t] - returned[t]) * 1e6 for t in returned if t in first_after)
assert len(lags) == n, f"{len(lags)} of {n} COMPLETED events seen"
print(json.dumps({"tree": str(app.__file__), "median_us": statistics.median(lags),
                  "p90_us": lags[int(0.9 * len(lags))], "mean_us": statistics.mean(lags)}))
plain.flushall()
"""

ROWS = (("processor's return → COMPLETED seen, median µs", "median_us", 0),
        ("the same, 90th percentile µs", "p90_us", 0), ("the same, mean µs", "mean_us", 0))


def run_child(tree: Path, url: str, n: int) -> dict[str, Any]:
    env = {**without_settings(os.environ), "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", CHILD, url, str(n), WATCHER], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"child in {tree} failed:\n{done.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["tree"].startswith(str(tree)):
        raise RuntimeError(f"child in {tree} imported {out['tree']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=500)
    args = parser.parse_args()
    names, results, machine = alternate_children(args.before, args.after, args.rounds, "end-latency-",
                                                 lambda tree, url: run_child(tree, url, args.tasks), ROWS)
    print(f"\n{args.tasks} no-op tasks a round, {args.rounds} rounds each, alternating; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print(table(names, results, ROWS, "Per task"))
    print(f"\nmachine: {json.dumps(machine)}")


if __name__ == "__main__":
    main()
