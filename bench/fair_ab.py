"""Fair dispatch for a single member alone: deliveries per second with the fair claim and with the one before it.

Issue 31 asks that a member alone keeps at least 0.95 times the throughput it had before fair dispatch. Both claims
run in the same run, alternating rounds (A B A B ...), as bench/delivery_ab.py runs its two trees: ``git archive``
of :data:`BEFORE` (the last commit before fair dispatch: FIFO queues, the claim's LMOVE) and of HEAD, each in a
child process of this venv against one valkey-server. Each round creates ``tasks`` no-op tasks of one member and
queues them as a submit does (``bench.fill.create_tasks``: with HEAD, each job put in its member's line), then an
in-process simple worker runs them in burst mode; an empty burst, its fixed cost, is subtracted. The target is on
deliveries per CPU-second (the worker's CPU and Redis's per delivery: :func:`cpu_bound`), which other work on a
shared machine does not skew; the tasks over the burst's wall time and the commands per delivery come along.

    .venv/bin/python bench/fair_ab.py                 # 3 rounds each, 2,000 tasks a round
    .venv/bin/python bench/run.py --only fair         # the same as a part of the bench table
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from bench import delivery_ab  # noqa: E402
from bench.report import Row, markdown  # noqa: E402
from bench.stack import Stack  # noqa: E402
from bench.trees import archive  # noqa: E402

BEFORE = "1098892"  # the commit before fair dispatch (issue 31): its claim moves the head of RQ's list
TARGET = 0.95  # the member alone keeps at least this share of its throughput (issue 31)


def measure(rounds: int = 3, tasks: int = 2000, before: str = BEFORE, after: str = "HEAD",
            stack: Stack | None = None) -> dict[str, Any]:
    """Alternating rounds of both claims: every round's figures per side, and the sides' commits. ``stack``: the
    bench's (its Redis is emptied by every round), or one of its own."""
    work = Path(tempfile.mkdtemp(prefix="fair-ab-"))
    try:
        trees = {side: (archive(rev, work / side), work / side)
                 for side, rev in (("before", before), ("after", after))}
        found: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        with contextlib.ExitStack() as owned:
            url = (stack or owned.enter_context(Stack())).redis_server.url
            for round_ in range(rounds):
                for side in ("before", "after") if round_ % 2 == 0 else ("after", "before"):  # A B, B A, ...
                    tree = trees[side][1]
                    result = delivery_ab.run_child(tree, url, tasks)
                    result["deliveries_per_s"] = 1000 / result["wall_ms"]
                    found[side].append(result)
                    print(f"fair: {side} {result['deliveries_per_s']:.0f} deliveries/s, "
                          f"{result['commands']:.1f} commands each", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"tasks": tasks, "rounds": rounds, "commits": {side: commit for side, (commit, _) in trees.items()},
            **found}


def _median(out: dict[str, Any], side: str, key: str) -> float:
    return statistics.median(r[key] for r in out[side])


def cpu_bound(result: dict[str, Any]) -> float:
    """Deliveries per second of CPU, the worker's and Redis's: the one worker waits for Redis at every round trip,
    so this is its throughput on a machine of its own; other work on a shared machine stretches the wall
    time of a round (``deliveries_per_s``) but not the CPU it took."""
    return 1000 / (result["worker_cpu_ms"] + result["redis_cpu_ms"])


def rows(out: dict[str, Any]) -> list[Row]:
    """The target row (deliveries per CPU-second, medians), the wall-clock row beside (the best round of each
    side, as the workers rows count) and the record's (Redis CPU and commands per delivery, medians)."""
    commits = out["commits"]
    cpu = [statistics.median(cpu_bound(r) for r in out[side]) for side in ("before", "after")]
    wall = [max(r["deliveries_per_s"] for r in out[side]) for side in ("before", "after")]
    what = f"({out['tasks']:,} no-op tasks, in-process simple worker; {out['rounds']} alternating rounds)"
    found = [Row(f"fair dispatch, one member alone: deliveries per CPU-second, worker + Redis {what}, median",
                 f"{cpu[1]:.0f} ({commits['after']})", f"{cpu[0]:.0f} ({commits['before']}: FIFO claim)",
                 f"{cpu[1] / cpu[0]:.2f}×", f"≥ {TARGET}×", "PASS" if cpu[1] / cpu[0] >= TARGET else "FAIL"),
             Row(f"fair dispatch, one member alone: deliveries/s, wall clock {what}, best round (for the record: "
                 "other work on the machine stretches it)", f"{wall[1]:.0f}", f"{wall[0]:.0f}",
                 f"{wall[1] / wall[0]:.2f}×")]
    for label, key, digits in (("Redis CPU ms per delivery", "redis_cpu_ms", 3),
                               ("Redis commands per delivery", "commands", 1)):
        b, a = _median(out, "before", key), _median(out, "after", key)
        found.append(Row(f"fair dispatch, one member alone: {label}", f"{a:.{digits}f}", f"{b:.{digits}f}",
                         f"{a / b:.2f}×" if b else "—"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--after", default="HEAD")
    args = parser.parse_args(argv)
    out = measure(args.rounds, args.tasks, args.before, args.after)
    for side in ("before", "after"):
        print(f"{side} ({out['commits'][side]}): " + ", ".join(f"{r['deliveries_per_s']:.0f}" for r in out[side])
              + " deliveries/s; per CPU-second " + ", ".join(f"{cpu_bound(r):.0f}" for r in out[side]))
    print(markdown(rows(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
