"""Durable checkpoints: how far a run got, saved with its progress, so the next run resumes there.

Not to be confused with a *cancellation point* (``ctx.check_cancelled()``, and every ``ctx.progress``,
``ctx.sleep`` and item boundary), where a run notices that it must stop. A checkpoint is what a run leaves
behind for the next one:

- the item runs (each ``ctx.each`` / ``ctx.items`` call of the processor, numbered in the order the
  processor makes them): how many items each has done, the results of the items ``ctx.each`` returns, the
  item counts, the failure records and the result's error code;
- the processor's own cursor (``ctx.save_cursor(value)``, read back as ``ctx.cursor``): a file offset,
  a page token, a date; any JSON value.

The context hands a :class:`Saved` to its ``report`` callable with the throttled progress write (at least
once a second while items advance), and the progress script writes both in one atomic step
(app.core.scripts): the checkpoint never says more than the progress, nor the other way round.

On the wire a checkpoint is a log of JSON lines, one appended per write (``APPEND``: a write costs what
changed, not what the run did so far): ``{"c": [total, succeeded, failed], "e": error_code, "f":
[failures since the last line], "r": [[run, declared, done, results], ...]}``, where ``results`` is the
list of results since the last line, or the number of them when they are all ``null`` (what most
processors return for an item), or absent for a ``ctx.items`` run (it returns nothing). Every
``COMPACT_EVERY`` lines the log is replaced by one line that says it all (every run with all its results,
every failure record kept), made from what the log holds (:attr:`Pending.stored`, the lines written) and
what is pending, never from the item runs the processor's thread is moving, so a log holds at most that many
lines: its size is bounded by the results ``ctx.each`` returns and the failure records, not by how long the
task runs (bench/checkpoint.py measures it). The cursor is a key of its own, overwritten. Both live in the
task's own keys and go when the task ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

# The failure records kept per task (the counts stay exact): see TaskContext.failures.
MAX_FAILURES = 1000
# Lines appended to a checkpoint log before the next write replaces it with one line that says it all.
COMPACT_EVERY = 50



@dataclass(frozen=True)
class Saved:
    """What one progress write saves besides the progress: a line for the log (b"" = nothing new), whether it
    replaces the log (a line that says it all), and the cursor's JSON (None = unchanged)."""

    line: bytes
    cursor: bytes | None
    replace: bool = False


@dataclass
class SavedRun:
    """One item run as earlier runs left it."""

    declared: int | None
    done: int
    results: list[Any] | None  # None: a ctx.items run, which keeps no results


@dataclass
class Resume:
    """What earlier runs of the task saved, as the next run restores it."""

    counts: list[int] | None = None
    error_code: int | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[int, SavedRun] = field(default_factory=dict)
    cursor: Any = None

    @classmethod
    def parse(cls, log: bytes | None, cursor: bytes | None) -> Resume | None:
        """The checkpoint stored as ``log`` and ``cursor``, or None when there is none."""
        if not log and not cursor:
            return None
        resume = cls(cursor=orjson.loads(cursor) if cursor else None)
        for line in (log or b"").splitlines():
            if line:
                resume._apply(orjson.loads(line))
        return resume

    def _apply(self, line: dict[str, Any]) -> None:
        self.counts = line["c"]
        self.error_code = line.get("e")
        room = MAX_FAILURES - len(self.failures)
        self.failures.extend(line.get("f", [])[:room])
        for run, declared, done, *results in line.get("r", []):
            saved = self.runs.setdefault(run, SavedRun(declared, 0, [] if results else None))
            saved.declared, saved.done = declared, done
            if results and saved.results is not None:
                new = results[0]
                saved.results.extend([None] * new if isinstance(new, int) else new)

    def copy(self) -> Resume:
        """A copy that shares no list with this one."""
        runs = {run: SavedRun(saved.declared, saved.done, None if saved.results is None else list(saved.results))
                for run, saved in self.runs.items()}
        return Resume(None if self.counts is None else list(self.counts), self.error_code, list(self.failures), runs,
                      self.cursor)

    @property
    def items_done(self) -> int:
        """Items done so far over every item run (what a log line can name when a run is lost)."""
        return sum(run.done for run in self.runs.values())


class Pending:
    """What the context learned since its last successful write, waiting for the next one."""

    def __init__(self, stored: Resume | None = None) -> None:
        # the checkpoint log as stored: what the run resumed from, then every line written since
        self.stored = stored.copy() if stored is not None else Resume()
        self.failures: list[dict[str, Any]] = []
        self.runs: dict[int, list[Any]] = {}  # run -> [declared, done, new results or None]
        self.cursor: bytes | None = None
        self.lines = 0  # lines appended since the log was last replaced

    @property
    def moved(self) -> bool:
        """Whether an item finished (or failed) since the last write."""
        return bool(self.runs or self.failures)

    def __bool__(self) -> bool:
        return self.moved or self.cursor is not None

    def item_done(self, run: int, declared: int | None, done: int, result: Any, keep: bool,
                  keeps_results: bool) -> None:
        """Item ``done`` of item run ``run`` finished; ``keep`` its result (a succeeded item of an each)."""
        entry = self.runs.setdefault(run, [declared, done, [] if keeps_results else None])
        entry[0], entry[1] = declared, done
        if keep:
            entry[2].append(result)

    def items_done(self, run: int, declared: int | None, done: int, results: list[Any]) -> None:
        """Items of ``ctx.each`` run ``run`` succeeded with ``results``, its ``done``-th the last of them."""
        entry = self.runs.setdefault(run, [declared, done, []])
        entry[0], entry[1] = declared, done
        entry[2].extend(results)

    def line(self, counts: list[int] | None, error_code: int | None) -> bytes:
        """The log line for everything pending (b"" when no item moved)."""
        if not self.moved:
            return b""
        runs = [entry(run, declared, done, results) for run, (declared, done, results) in self.runs.items()]
        return _line(counts, error_code, runs, self.failures)

    def take(self, counts: list[int] | None, error_code: int | None) -> Saved | None:
        """The pending write as a :class:`Saved` (None when there is nothing to save): a line to append, or
        every ``COMPACT_EVERY`` lines one that replaces the log; :meth:`clear` it once the write went through, so
        a failed write is retried with the next one."""
        if not self:
            return None
        if self.moved and self.lines >= COMPACT_EVERY:
            return Saved(self._whole(counts, error_code), self.cursor, replace=True)
        return Saved(self.line(counts, error_code), self.cursor)

    def _whole(self, counts: list[int] | None, error_code: int | None) -> bytes:
        """The line that says it all: what the log holds (:attr:`stored`) with what is pending. Built from the
        saved state, never from the item runs, which the processor's thread moves while another thread (the
        heartbeat's flush) writes: a fold caught half-way would otherwise be dropped from the log for good."""
        merged = {run: SavedRun(saved.declared, saved.done, saved.results) for run, saved in self.stored.runs.items()}
        for run, (declared, done, results) in self.runs.items():
            found = merged.setdefault(run, SavedRun(declared, done, None if results is None else []))
            found.declared, found.done = declared, done
            if results is not None and found.results is not None:
                found.results = found.results + results  # a new list: the stored one stays what was written
        runs = [entry(run, saved.declared, saved.done, saved.results) for run, saved in sorted(merged.items())]
        return _line(counts, error_code, runs, (self.stored.failures + self.failures)[:MAX_FAILURES])

    def clear(self, saved: Saved) -> None:
        """``saved`` went through: what it wrote is now in :attr:`stored` (read as the next run will read it),
        and no longer pending."""
        if saved.line:
            if saved.replace:
                self.stored = Resume()
            self.stored._apply(orjson.loads(saved.line))
            self.failures, self.runs = [], {}
            self.lines = 1 if saved.replace else self.lines + 1
        if saved.cursor is not None and saved.cursor is self.cursor:
            self.cursor = None


def entry(run: int, declared: int | None, done: int, results: list[Any] | None) -> list[Any]:
    """One item run's entry in a log line: its results as a count when they are all null."""
    found: list[Any] = [run, declared, done]
    if results is not None:
        found.append(len(results) if all(r is None for r in results) else results)
    return found


def _line(counts: list[int] | None, error_code: int | None, runs: list[list[Any]],
          failures: list[dict[str, Any]]) -> bytes:
    doc: dict[str, Any] = {"c": counts or [0, 0, 0], "e": error_code, "r": runs}
    if failures:
        doc["f"] = failures
    return orjson.dumps(doc)
