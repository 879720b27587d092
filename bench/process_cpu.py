"""CPU seconds per process from ``/proc``, per operation: the bench's headline figures (issue 32).

A throughput ratio on a machine whose cores the web, the workers, Redis and the load generator share mixes
what each side costs with how the cores happened to be shared; what a user buys is CPU, and a process's
CPU per operation holds from machine to machine. So every measured window is bracketed by a snapshot of
each named process group (``{"web": [gunicorn's pid], "workers": [...], "redis": [...]}``): a root pid and
every descendant alive at the snapshot (gunicorn's workers, an RQ work horse, a prefork child), each its
``utime + stime`` plus ``cutime + cstime``, the CPU of the children it has reaped. A child that exits inside
the window is counted whole in its parent's ``cutime`` at the second snapshot, less what it had spent at the
first, so the difference is the window's CPU of the group, children included, with nothing counted twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

TICK = os.sysconf("SC_CLK_TCK")
TOTAL = "every process"  # the key of the groups' sum in per_op's answer
T = TypeVar("T")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (each thread's ``children`` file: a thread may fork), as alive now."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in children.read_text().split()]
            except OSError:
                continue  # the thread ended meanwhile
    return found


def own_and_reaped(pid: int) -> float:
    """CPU seconds of ``pid`` itself (all its threads) and of the children it has waited for (0.0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK  # utime, stime, cutime, cstime


def tree_cpu(roots: Iterable[int]) -> float:
    return sum(own_and_reaped(p) for root in roots for p in descendants(root))


def snapshot(groups: Mapping[str, Iterable[int]]) -> dict[str, float]:
    return {name: tree_cpu(roots) for name, roots in groups.items()}


def measured(groups: Mapping[str, Iterable[int]], run: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """``run()``'s answer and the CPU seconds each group spent while it ran."""
    fixed = {name: list(roots) for name, roots in groups.items()}
    before = snapshot(fixed)
    value = run()
    after = snapshot(fixed)
    return value, {name: max(0.0, after[name] - before[name]) for name in fixed}


def per_op(seconds: Mapping[str, float], ops: int) -> dict[str, float]:
    """CPU ms per operation of each group, and of all of them summed (:data:`TOTAL`)."""
    n = max(ops, 1)
    out = {name: round(s * 1000 / n, 4) for name, s in seconds.items()}
    out[TOTAL] = round(sum(seconds.values()) * 1000 / n, 4)
    return out


def with_cpu(groups: Mapping[str, Iterable[int]], run: Callable[[], dict[str, Any]],
             ops: Callable[[dict[str, Any]], int]) -> dict[str, Any]:
    """``run()``'s figures with ``cpu_ms_per_op`` added: each group's CPU over ``ops(figures)`` operations."""
    found, seconds = measured(groups, run)
    found["cpu_ms_per_op"] = per_op(seconds, ops(found))
    return found


def least(runs: Iterable[dict[str, Any]]) -> dict[str, float] | None:
    """Of rounds that carry ``cpu_ms_per_op``, the one with the least CPU summed (other work on the machine only
    ever adds to it, as it only ever slows a round down); None if none carries it."""
    found = [r["cpu_ms_per_op"] for r in runs if "cpu_ms_per_op" in r]
    return min(found, key=lambda c: c[TOTAL]) if found else None
