"""Two source trees side by side, for the before/after tools (bench/before_after.py, bench/delivery_ab.py,
bench/web_cpu_ab.py): each commit unpacked with ``git archive`` into a directory of its own (its processes run
with that directory as cwd and ``PYTHONPATH``, so they import its ``app`` and ``workers``), and the table of
their alternating rounds."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
