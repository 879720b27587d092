"""Shared rate limits (issue 31): how closely ``ctx.limit`` holds its rate across workers, and what a call costs.

    .venv/bin/python bench/main.py --only limits        (or: .venv/bin/python bench/ratelimit.py [--seconds 30])

- **accuracy**: 4 simple taskport workers (real processes) on the bench's embedded redis-server, each running one
  ``test.rated`` task (tests/userprocs/limits.py) that calls ``ctx.limit("erp", 20, per=1)`` before each item and
  returns the time each token was used. The tokens are one full bucket (20) plus 20 a second for ``--seconds``.
  Measured from the tokens' use times: the rate past the bucket over the whole window (target: at most 20/s, and
  at least 0.95 x: the limit is not much slower than it says), and the most tokens used in any 1 s window and
  in any ``--seconds`` s window (target: at most 20 x window + 20, one bucket).
- **cost per call**: ``RateLimiter.take`` in-process against the same server, on a limit it never has to wait
  for, ``--calls`` times: microseconds per call (wall clock, median of 3 rounds) beside one bare ``GET`` round
  trip on the same connection, and the Redis commands per call (``INFO commandstats`` before and after: the
  EVALSHA and what the script runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core.answers import NewTask  # noqa: E402
from app.core.config import Config  # noqa: E402
from app.core.jobs import JobQueue  # noqa: E402
from app.core.states import TaskStatus  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from bench.report import Row  # noqa: E402

MODULE = "tests.userprocs.limits"
RATE = 20
WORKERS = 4


def most_in(times: list[float], window: float) -> int:
    """The most uses in any window of ``window`` seconds (each window starting at a use); also the rate tests'."""
    times = sorted(times)
    most, end = 0, 0
    for start, t in enumerate(times):
        while end < len(times) and times[end] < t + window:
            end += 1
        most = max(most, end - start)
    return most


def accuracy(stack: Any, seconds: float) -> dict[str, Any]:
    """4 workers share ``erp`` at 20/s for ``seconds`` s past a full bucket: the tokens' use times, measured."""
    from dataclasses import replace

    config = replace(stack.config, processors=MODULE)
    conn = stack.client()
    conn.flushall()
    workers = stack.start_workers("simple", WORKERS, config=config)
    try:
        store, jobs = TaskStore(conn, config), JobQueue(conn, config)
        tokens = RATE + int(RATE * seconds)
        per_task = -(-tokens // WORKERS)
        ids = []
        for _ in range(WORKERS):
            task_id = str(uuid.uuid4())
            store.create(NewTask(task_id, "bench", "test.rated", {"limit": "erp", "rate": RATE, "per": 1,
                                                                  "items": per_task}, task_id, "default", 1),
                         jobs.job_commands(task_id, "default", 120))
            ids.append(task_id)
        deadline = time.monotonic() + seconds * 2 + 60
        while time.monotonic() < deadline:
            found = [store.get(t) for t in ids]
            if all(t is not None and t.status not in (TaskStatus.PENDING, TaskStatus.PROCESSING) for t in found):
                break
            time.sleep(0.5)
        used = sorted(u for t in ids for u in (store.get_with_result(t).result or {}).get("result", {}).get("used", []))
    finally:
        stack.stop(*workers)
        conn.close()
    span = used[-1] - used[0] if len(used) > 1 else 0.0
    return {"tokens": len(used), "expected": per_task * WORKERS, "span_s": round(span, 3),
            "rate_past_bucket": round((len(used) - RATE) / span, 3) if span else 0.0,
            "most_1s": most_in(used, 1.0), "most_window": most_in(used, seconds), "window_s": seconds}


def cost(stack: Any, calls: int, rounds: int = 3) -> dict[str, Any]:
    """µs and Redis commands per ``RateLimiter.take`` that never waits, beside one GET round trip."""
    from workers.ratelimit import RateLimiter

    conn = stack.client()
    store = TaskStore(conn, Config.from_env({}, redis_url=stack.config.redis_url))
    take = RateLimiter(store, store.config, "bench")
    take.take("cost", 1e8, 1)  # the script loaded
    per_take, per_get = [], []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(calls):
            take.take("cost", 1e8, 1)
        per_take.append((time.perf_counter() - began) / calls * 1e6)
        began = time.perf_counter()
        for _ in range(calls):
            conn.get("bench:nothing")
        per_get.append((time.perf_counter() - began) / calls * 1e6)
    conn.config_resetstat()
    for _ in range(calls):
        take.take("cost", 1e8, 1)
    stats = conn.info("commandstats")
    commands = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
                if name not in ("cmdstat_info", "cmdstat_config|resetstat") and int(v["calls"])}
    conn.close()
    return {"calls": calls, "us_per_call": round(statistics.median(per_take), 1),
            "us_per_get": round(statistics.median(per_get), 1),
            "commands_per_call": {k: round(v / calls, 2) for k, v in sorted(commands.items())}}


def measure(stack: Any, seconds: float = 30.0, calls: int = 5000) -> dict[str, Any]:
    return {"accuracy": accuracy(stack, seconds), "cost": cost(stack, calls)}


def rows(out: dict[str, Any]) -> list[Row]:
    a, c = out["accuracy"], out["cost"]
    window = a["window_s"]
    bound_1s, bound_window = RATE + RATE, RATE * window + RATE
    ok = (a["tokens"] == a["expected"] and a["rate_past_bucket"] <= RATE * 1.01 and a["most_1s"] <= bound_1s
          and a["most_window"] <= bound_window)
    inside = sum(c["commands_per_call"].values())
    return [
        Row(f'rate limit accuracy: ctx.limit("erp", {RATE}, per=1) on {WORKERS} simple workers, {a["tokens"]} tokens '
            f"over {a['span_s']:.1f} s (a full bucket, then {window:g} s)",
            f"{a['rate_past_bucket']:.2f} tokens/s past the bucket; most in 1 s {a['most_1s']}, in {window:g} s "
            f"{a['most_window']}",
            f"{RATE}/s; 1 s: {bound_1s}, {window:g} s: {bound_window:g}", f"{a['rate_past_bucket'] / RATE:.3f}×",
            "≤ 20/s + one bucket (20) in every window", "PASS" if ok else "FAIL"),
        Row("cost per ctx.limit call that takes a token at once (RateLimiter.take, in-process)",
            f"{c['us_per_call']:.0f} µs, 1 round trip (EVALSHA), {inside:.0f} Redis commands: "
            + ", ".join(f"{k} {v:g}" for k, v in c["commands_per_call"].items()),
            f"one GET round trip {c['us_per_get']:.0f} µs", f"{c['us_per_call'] / c['us_per_get']:.2f}×"),
    ]


def main(argv: list[str] | None = None) -> int:
    from bench.report import markdown
    from bench.stack import Stack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of tokens past the bucket (default 30)")
    parser.add_argument("--calls", type=int, default=5000, help="calls of the cost row (default 5000)")
    args = parser.parse_args(argv)
    with Stack() as stack:
        out = measure(stack, args.seconds, args.calls)
    print(out)
    print(markdown(rows(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
