"""Where a batch submit's time goes (issue 21; not part of ``make bench``): in-process, on a scratch embedded
Redis, a minute or less.

    .venv/bin/python bench/batch_profile.py [--rounds 5]

1. Per task, for batches of 1, 10, 100 and 1,000 (1 = ``POST /api/v1/tasks``): the web's CPU (the WSGI app
   through Flask's test client, ``time.process_time``), Redis's (``INFO commandstats`` usec of the script
   call, which includes the commands it runs; and the redis-server process's CPU from ``/proc``, which adds
   reading the request, the append-only file's copy of every write and the reply) and the tasks a second one
   client gets through, one request after another (web and Redis in turn: their sum, as a rate).
2. The batch create script of one real 1,000-task ``POST /api/v1/batches`` (captured at ``TaskStore.run_script``)
   replayed with EVAL on a flushed Redis, as is and with one part of its Lua neutralized in a copy of the source
   (the product's script is not touched): what each part costs Redis per task. Beside it the submit script,
   1,000 calls.

Prints two markdown tables (median of ``--rounds``). One RQ worker is registered on every queue, as in
production, so a submit takes its usual path.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from rq import Worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core import keys  # noqa: E402
from app.core.config import Config  # noqa: E402
from app.core.states import QUEUES  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402
from app.web import create_app  # noqa: E402
from bench.loadgen import SUBMIT_BODY, batch_body  # noqa: E402
from bench.process_cpu import own_and_reaped  # noqa: E402

SIZES = (1, 10, 100, 1000)
_NO_AUDIT = ("local function replay(", "local function audit() end\nlocal function audit_entry() end\n"
             "local function audit_values() end\nlocal function replay(")  # the create writes by audit_values
_NO_JOB = ("\nlocal function sibling(", "\nlocal function replay() end\nlocal function sibling(")
VARIANTS = {  # label -> (old, new) replacements in the batch script's source
    "as is": [],
    "no audit entry (audit(), audit_entry() and audit_values() no-ops)": [_NO_AUDIT],
    "audit entry without its XTRIM": [("if max_age_ms > 0 then", "if false then")],
    "no RQ job (replay() a no-op)": [_NO_JOB],
    "neither audit entry nor RQ job": [_NO_AUDIT, _NO_JOB],
}


def usec(conn: redis.Redis, command: str) -> int:
    stats: Any = conn.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("usec", 0))


def fresh(conn: redis.Redis) -> None:
    conn.flushall()
    Worker(list(QUEUES), connection=conn).register_birth()


def per_size(client: Any, conn: redis.Redis, server_pid: int, rounds: int,
             sizes: tuple[int, ...] = SIZES) -> dict[int, tuple[float, ...]]:
    """Per task: (web CPU µs, Redis µs of the script, Redis process CPU µs, tasks/s), median of ``rounds``, for
    each of ``sizes``."""
    found: dict[int, list[tuple[float, ...]]] = {size: [] for size in sizes}
    n = 0
    for _ in range(rounds):
        for size in sizes:
            fresh(conn)
            reps = max(5, 2000 // size)
            u0, c0, r0, w0 = usec(conn, "evalsha"), time.process_time(), own_and_reaped(server_pid), time.perf_counter()
            for _ in range(reps):
                if size == 1:
                    answer = client.post("/api/v1/tasks", data=SUBMIT_BODY % n, content_type="application/json")
                else:
                    answer = client.post("/api/v1/batches", data=batch_body(n, size), content_type="application/json")
                assert answer.status_code == 202, answer.get_data(as_text=True)[:300]
                n += size
            wall, web, red = time.perf_counter() - w0, time.process_time() - c0, own_and_reaped(server_pid) - r0
            tasks = reps * size
            found[size].append((web / tasks * 1e6, (usec(conn, "evalsha") - u0) / tasks, red / tasks * 1e6,
                                tasks / wall))
    return {size: tuple(statistics.median(row[i] for row in f) for i in range(4)) for size, f in found.items()}


def per_part(client: Any, conn: redis.Redis, rounds: int) -> dict[str, float]:
    """Redis µs per task of the captured 1,000-task batch script, per variant; and of the submit script."""
    captured: dict[str, tuple[str, list[Any], list[Any]]] = {}
    run_script = TaskStore.run_script

    def spy(self: TaskStore, name: str, keys_: list[str], args: list[Any], client: Any = None, *,
            acknowledged: bool = False) -> Any:
        captured[name] = (self._sources[name], [*keys_, keys.AUDIT], list(args))
        return run_script(self, name, keys_, args, client, acknowledged=acknowledged)

    TaskStore.run_script = spy  # type: ignore[method-assign]
    try:
        fresh(conn)
        assert client.post("/api/v1/batches", data=batch_body(10**9, 1000), content_type="application/json") \
            .status_code == 202
        batch = captured.pop("batch_create")
        assert client.post("/api/v1/tasks", data=SUBMIT_BODY % (2 * 10**9), content_type="application/json") \
            .status_code == 202
        single = next(iter(captured.values()))
    finally:
        TaskStore.run_script = run_script  # type: ignore[method-assign]
    found: dict[str, list[float]] = {label: [] for label in VARIANTS}
    found["submit script, 1,000 calls"] = []
    src, bkeys, bargs = batch
    for _ in range(rounds):
        for label, edits in VARIANTS.items():
            variant = src
            for old, new in edits:
                assert old in variant, f"the batch script changed: {old!r} is gone; update bench/batch_profile.py"
                variant = variant.replace(old, new, 1)
            fresh(conn)
            u0 = usec(conn, "eval")
            conn.eval(variant, len(bkeys), *bkeys, *bargs)
            found[label].append((usec(conn, "eval") - u0) / 1000)
        fresh(conn)
        ssrc, skeys, sargs = single
        sha = conn.script_load(ssrc)
        u0 = usec(conn, "evalsha")
        for _ in range(1000):
            conn.delete(skeys[0])  # its dedup key: so that each call creates (over the same task key)
            conn.evalsha(sha, len(skeys), *skeys, *sargs)
        found["submit script, 1,000 calls"].append((usec(conn, "evalsha") - u0) / 1000)
    return {label: statistics.median(v) for label, v in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=lambda text: tuple(int(n) for n in text.split(",")), default=SIZES,
                        help="batch sizes, comma-separated (default: 1,10,100,1000)")
    parser.add_argument("--no-parts", action="store_true", help="the first table only")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the open-mode warning
    with tempfile.TemporaryDirectory(prefix="tp-batch-") as tmp:
        base = Config.from_env({}, data_dir=Path(tmp), api_keys="")
        with EmbeddedRedis(base) as server:
            config = replace(base, redis_url=server.url)
            conn = server.client(timeout=60)
            client = create_app(config, conn=server.client(timeout=60)).test_client()
            assert server.pid is not None
            sizes = per_size(client, conn, server.pid, args.rounds, args.sizes)
            parts = {} if args.no_parts else per_part(client, conn, args.rounds)
    print("| tasks a request | web CPU µs per task | Redis µs per task (the script, its commands included) "
          "| Redis process CPU µs per task | tasks/s, one client |")
    print("| --- | --- | --- | --- | --- |")
    for size, (web, red, proc, rate) in sizes.items():
        print(f"| {size:,}{' (POST /api/v1/tasks)' if size == 1 else ''} | {web:,.0f} | {red:,.0f} | {proc:,.0f} "
              f"| {rate:,.0f} |")
    if parts:
        print("\n| batch create script of 1,000 tasks, replayed | Redis µs per task |\n| --- | --- |")
    for label, value in parts.items():
        print(f"| {label} | {value:,.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
