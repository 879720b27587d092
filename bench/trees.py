"""Two source trees side by side, for the before/after tools (bench/before_after.py, bench/delivery_ab.py,
bench/end_latency.py, bench/web_cpu_ab.py): each commit unpacked with ``git archive`` into a directory of its own
(its processes run with that directory as cwd and ``PYTHONPATH``, so they import its ``app`` and ``workers``),
their children run alternately (:func:`alternate_children`) and the table of their rounds."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.machine import CpuWatch
from bench.stack import Stack

REPO = Path(__file__).resolve().parents[1]


def archive(rev: str, into: Path) -> str:
    """``git archive rev`` unpacked in ``into``; returns the commit's short hash."""
    into.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()


def before_and_after(before: str, after: str, work: Path) -> dict[str, Path]:
    """Both commits unpacked under ``work``: {name: tree}, before first (a name twice gets its side added)."""
    trees: dict[str, Path] = {}
    for side, rev in (("before", before), ("after", after)):
        short = archive(rev, work / side)
        trees[short if short not in trees else f"{short} ({side})"] = work / side
    return trees


def table(names: tuple[str, str], results: dict[str, list[dict[str, Any]]],
          rows: Sequence[tuple[str, str, int]], first: str = "") -> str:
    """Each row's rounds and median per tree, and after/before of the medians (markdown)."""
    before, after = names
    lines = [f"| {first} | before ({before}): rounds → median | after ({after}): rounds → median | after/before |",
             "| --- | --- | --- | --- |"]
    for label, key, digits in rows:
        cells, medians = [], []
        for name in names:
            values = [r[key] for r in results[name]]
            medians.append(statistics.median(values))
            cells.append(", ".join(f"{v:.{digits}f}" for v in values) + f" → **{medians[-1]:.{digits}f}**")
        ratio = f"{medians[1] / medians[0]:.2f}×" if medians[0] else "—"
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def alternate_children(before: str, after: str, rounds: int, prefix: str,
                       run: Callable[[Path, str], dict[str, Any]],
                       rows: Sequence[tuple[str, str, int]]) -> tuple[tuple[str, str], dict[str, list[dict[str, Any]]],
                                                                     dict[str, Any]]:
    """Both commits unpacked (:func:`before_and_after`) and ``run(tree, redis_url)`` called for each, alternating,
    ``rounds`` times, against one valkey-server started for the run (bench/delivery_ab.py, bench/end_latency.py:
    each run a child process of its tree); each round's ``rows`` printed as it ends. Returns the names, each
    side's results in order and the machine's report (``bench.machine.CpuWatch``)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    watch = CpuWatch().start()
    try:
        trees = before_and_after(before, after, work)
        names = (list(trees)[0], list(trees)[1])
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        with Stack() as stack:
            for round_ in range(rounds):
                for name in names:
                    results[name].append(run(trees[name], stack.redis_server.url))
                    print(f"round {round_ + 1} {name}: " + ", ".join(
                        f"{label} {results[name][-1][key]:.{digits}f}" for label, key, digits in rows), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return names, results, watch.report()

