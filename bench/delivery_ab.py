"""A delivery's cost before and after, in the same run: worker CPU, Redis CPU, Redis commands, round trips.

Each tree (``git archive`` of two commits, issue 29's base f768fba and HEAD by default) runs in a child
process of the same venv (``PYTHONPATH`` and cwd the tree, so its ``app``, ``workers`` and ``bench`` are
imported, not the checkout's) against one valkey-server started for the run (``bench.stack.Stack``: the
embedded server as ``make bench`` starts it). The child does what ``bench.measure_redis.worker_round_trips``
does for taskport, with helpers both trees have (``bench.fill.create_tasks``, ``bench.counting``,
``workers.worker.WORKER_CLASSES``): ``n`` no-op tasks created and queued, then an in-process simple worker
in burst mode; an empty burst is the worker's fixed cost, subtracted. Measured around each burst: the
child's ``time.process_time`` (the worker process's CPU, the in-process Runner included), the server's
``INFO cpu`` (used_cpu_user + used_cpu_sys), ``INFO commandstats`` calls (a script counts as its EVALSHA
plus every command it runs) and the client's round trips. Rounds alternate (A B A B ...), so other work on
the machine falls on both sides alike; the table gives every round and the median.

    .venv/bin/python bench/delivery_ab.py                      # 3 rounds each, 2,000 tasks a round
    .venv/bin/python bench/delivery_ab.py --rounds 5 --tasks 1000 --before f768fba --after HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from app.core.config import without_settings  # noqa: E402
from bench.trees import alternate_children, table  # noqa: E402

# Runs inside a tree; only APIs that f768fba and today both have.
CHILD = r"""
import json, sys, tempfile, time
import redis
import app, bench.fill
from app.core import keys
from app.core.config import Config
from app.core.states import QUEUES
from bench.counting import CountingConnection, command_delta, commandstats, counting_client
from bench.fill import create_tasks
from workers import runner as runner_module
from workers.worker import WORKER_CLASSES

url, n = sys.argv[1], int(sys.argv[2])
config = Config.from_env({}, data_dir=tempfile.mkdtemp(prefix="delivery-ab-"), redis_url=url, api_keys="")
plain = redis.Redis.from_url(url, socket_timeout=30)
conn = counting_client(config)
runner_module.use(runner_module.Runner(config, conn))


def server_cpu():
    info = plain.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def burst(fill):
    plain.flushall()
    if fill:
        create_tasks(plain, config, fill, enqueue=True, base=70_000_000)
    CountingConnection.reset()
    before, redis0, cpu0, wall0 = commandstats(plain), server_cpu(), time.process_time(), time.perf_counter()
    WORKER_CLASSES["simple"](list(QUEUES), connection=conn).work(burst=True, logging_level="WARNING")
    cpu, wall, redis_cpu = time.process_time() - cpu0, time.perf_counter() - wall0, server_cpu() - redis0
    trips = CountingConnection.reset()
    return {"worker_cpu": cpu, "wall": wall, "redis_cpu": redis_cpu, "trips": trips,
            "commands": command_delta(before, commandstats(plain))}


burst(50)  # imports, connections, scripts loaded
fixed, full = burst(0), burst(n)
done = int(plain.hget(keys.STATS, "completed") or 0)
assert done == n, f"{done} of {n} tasks COMPLETED"
names = set(full["commands"]) | set(fixed["commands"])
per = {k: full["commands"].get(k, 0) - fixed["commands"].get(k, 0) for k in names}
print(json.dumps({
    "tree": str(app.__file__), "fill": str(bench.fill.__file__),
    "worker_cpu_ms": (full["worker_cpu"] - fixed["worker_cpu"]) * 1000 / n,
    "redis_cpu_ms": (full["redis_cpu"] - fixed["redis_cpu"]) * 1000 / n,
    "commands": sum(per.values()) / n, "round_trips": (full["trips"] - fixed["trips"]) / n,
    "wall_ms": (full["wall"] - fixed["wall"]) * 1000 / n,
    "per_command": {k: round(v / n, 3) for k, v in sorted(per.items()) if v}}))
plain.flushall()
"""

ROWS = (("worker CPU ms", "worker_cpu_ms", 3), ("Redis CPU ms", "redis_cpu_ms", 3),
        ("Redis commands", "commands", 2), ("round trips", "round_trips", 2), ("wall ms", "wall_ms", 3))


def run_child(tree: Path, url: str, n: int) -> dict[str, Any]:
    env = {**without_settings(os.environ), "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", CHILD, url, str(n)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"child in {tree} failed:\n{done.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["tree"].startswith(str(tree)) or not out["fill"].startswith(str(tree)):
        raise RuntimeError(f"child in {tree} imported {out['tree']}, {out['fill']}")
    return out


def commands_table(names: tuple[str, str], results: dict[str, list[dict[str, Any]]]) -> str:
    """Each command's calls per delivery, the mean over the rounds (they differ by a few hundredths)."""
    mean = {name: {k: statistics.mean(r["per_command"].get(k, 0) for r in results[name])
                   for k in {k for r in results[name] for k in r["per_command"]}} for name in names}
    every = sorted(k for k in set(mean[names[0]]) | set(mean[names[1]])
                   if max(abs(mean[names[0]].get(k, 0)), abs(mean[names[1]].get(k, 0))) >= 0.005)
    lines = [f"| command | {names[0]} | {names[1]} |", "| --- | --- | --- |"]
    lines += [f"| {k} | {mean[names[0]].get(k, 0):.2f} | {mean[names[1]].get(k, 0):.2f} |" for k in every]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="f768fba")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    names, results, machine = alternate_children(args.before, args.after, args.rounds, "delivery-ab-",
                                                 lambda tree, url: run_child(tree, url, args.tasks), ROWS)
    print(f"\n{args.tasks} no-op tasks a round, {args.rounds} rounds each, alternating; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print(table(names, results, ROWS, 'Per delivery'))
    print()
    print(commands_table(names, results))
    print(f"\nmachine: {json.dumps(machine)}")


if __name__ == "__main__":
    main()
