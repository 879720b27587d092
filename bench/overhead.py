"""What the processor API costs per item and per row (issue 23): in-process, on a scratch embedded Redis.

    .venv/bin/python bench/overhead.py [--rounds 3] [--items 100000] [--rows 200000]

Both parts run the product's own code on a real embedded redis-server (``app.launch.embedded``, a temp dir,
``Config`` defaults: a progress write, and with it the checkpoint, at most every 0.5 s). Each taskport run
is one real task: ``TaskStore.create`` then ``TaskStore.start`` (the delivery's claim), its ``TaskContext``
built by ``Runner._context`` exactly as ``Runner.run`` builds it for a delivery (the report callable that
writes progress and checkpoint through the progress script, the run's result folder, the task's logger).
Not included: the heartbeat thread (one Redis round trip a second, whatever the items) and the task's start
and completion (once per task); what is timed is the processor's own loop.

- **per item**: ``ctx.each(range(items), noop)`` where ``noop`` does nothing, except that every 100th
  item raises ``ItemError(10002, ...)`` (1 % failed with a business code). The context counts each
  outcome, keeps the failure records, formats the item's progress and keeps the checkpoint's bookkeeping
  (the item runs' positions, the failures since the last write). The baseline is a bare Python loop that
  calls the same ``noop`` on each item and appends ``(True, result)`` or ``(False, code)`` to a list.
  Target: items/s ≥ 0.5× the bare loop. For the record: the same context with the checkpoint machinery
  out (no per-item checkpoint bookkeeping, no checkpoint in the writes; progress and counts as before).
- **per row**: the ``orders.export`` processor, called in-process with ``{"rows": rows, "format": ...}``
  (the schema's defaults: one year from 2026-01-01), writing to the default local result store in the
  temp dir, for CSV (resumable writer, a cursor saved with an fsync at most every progress interval) and
  XLSX (openpyxl write-only). The baseline is a bare script writing the same rows with the same library
  to a file: ``csv.writer`` on a text file, one ``writerow`` a row; an openpyxl write-only workbook saved
  to a path. Both sides generate the rows with the processor's own ``make_row`` (the rows are the task's
  data, not its overhead), so the CSV files are byte-identical and the XLSX sheets' XML is (checked each
  run). The product's fsyncs (cursor saves, the final one) count on its side, as part of what it costs.
  Target: rows/s ≥ 0.9× bare, each format.

Each round runs every taskport variant right beside its baseline, alternating which goes first; ``--rounds``
rounds (default 3). The rates shown are medians over the rounds; a ratio is the median of the rounds' own
ratios (each taken from two adjacent runs, so that a machine shared with other work weighs on both alike). A
small warm-up of every variant comes first and is not counted; each timed run starts after a ``gc.collect()``.
Prints the bench table (bench/report.py's rows); exits 0 whatever the verdicts.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import hashlib
import logging
import statistics
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core import keys, processors  # noqa: E402
from app.core.answers import NewTask  # noqa: E402
from app.core.config import Config  # noqa: E402
from app.core.ids import new_run_id  # noqa: E402
from app.core.logs import task_logger  # noqa: E402
from app.core.states import BusinessCode  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402
from bench.report import Row, _check, _ratio, markdown  # noqa: E402
from workers.checkpoint import Pending, Resume, Saved  # noqa: E402
from workers.context import TaskContext  # noqa: E402
from workers.exceptions import ItemError  # noqa: E402
from workers.processors.orders_export import HEADER, date_range, make_row  # noqa: E402
from workers.runner import Runner  # noqa: E402

FAIL_EVERY = 100  # every 100th item fails: 1 %
FAIL_CODE = BusinessCode.INVALID_QUANTITY
ITEMS_TARGET, ROWS_TARGET = 0.5, 0.9
FORMATS = ("csv", "xlsx")
WARM_UP = 500  # items and rows of the uncounted warm-up run of each variant: enough to import and fill caches

log = logging.getLogger("bench.overhead")


def noop(item: int) -> Any:
    """The item's work: nothing, except that every FAIL_EVERY-th item fails with a business code. Its result is
    None, what most processors' items return (and what the checkpoint log stores as a count)."""
    if item % FAIL_EVERY == FAIL_EVERY - 1:
        raise ItemError(FAIL_CODE, "bench item failed")
    return None


# -- a task run as a delivery has it ---------------------------------------------------------------------------


@dataclass
class Delivery:
    """One started task and its context, as Runner.run has them when it calls the processor."""

    task_id: str
    payload: dict[str, Any]
    ctx: TaskContext
    writes: list[int]  # [progress writes the context made]: proof the Redis round trips happened


def deliver(runner: Runner, task_type: str, payload: dict[str, Any]) -> Delivery:
    """Create the task, start it (the delivery's claim) and build its context the way Runner.run does."""
    task_id = str(uuid.uuid4())
    runner.store.create(NewTask(task_id, "bench", task_type, payload, uuid.uuid4().hex, "default", 1))
    run_id = new_run_id()
    started = runner.store.start(task_id, run_id).started
    assert started is not None, "the bench task did not start"
    ctx = runner._context(started.task, run_id, None, task_logger(log, task_id))
    writes = [0]
    report = ctx._report_fn

    def counted(progress: int | None, message: str, items: dict | None, saved: Saved | None) -> str:
        writes[0] += 1  # one increment per write (a few a second): nothing beside the round trip it counts
        return report(progress, message, items, saved)

    ctx._report_fn = counted
    return Delivery(task_id, started.payload, ctx, writes)


def finish(runner: Runner, run: Delivery) -> Resume | None:
    """Flush the context (untimed), read back the checkpoint it saved, then end the task and its files."""
    run.ctx.flush()
    conn = runner.store.redis
    saved = Resume.parse(conn.get(keys.checkpoint(run.task_id)), conn.get(keys.cursor(run.task_id)))
    runner.store.cancel(run.task_id)  # drops the payload and the checkpoint, as bench/checkpoint.py does
    runner.results.delete(run.task_id)
    return saved


# -- per item --------------------------------------------------------------------------------------------------


class _NoSaves(Pending):
    """A Pending that never has anything to save: the context's writes carry progress and counts only."""

    def item_done(self, *args: Any, **kwargs: Any) -> None:
        return None

    def items_done(self, *args: Any, **kwargs: Any) -> None:  # ctx.each's successes, a batch at a time
        return None

    def take(self, *args: Any, **kwargs: Any) -> Saved | None:
        self.failures.clear()  # the failure records stay in the context (for the result), not here
        return None


def without_checkpoints(ctx: TaskContext) -> None:
    """Take the resume feature's checkpoint machinery out of ``ctx``: no per-item bookkeeping, no checkpoint
    in its writes. For the record only: a real run always has it."""
    ctx._pending = _NoSaves()
    setattr(ctx, "_item_done", lambda run, result, succeeded: None)  # noqa: B010 (mypy: a method, not an attribute)


def taskport_items(runner: Runner, n: int, checkpoints: bool = True) -> dict[str, Any]:
    """``ctx.each`` over ``n`` no-op items of a started task: items/s and the outcomes as counted."""
    # a task of a built-in type; its payload is never read: the bench is the processor, calling ctx.each itself
    run = deliver(runner, "demo.sleep", {"seconds": 0, "steps": 1, "items": n, "fail_items": [], "fail_code": None})
    if not checkpoints:
        without_checkpoints(run.ctx)
    gc.collect()
    began = time.perf_counter()
    results = run.ctx.each(range(n), noop)
    seconds = time.perf_counter() - began
    counts = run.ctx.item_counts or {}
    found = {"items_per_s": n / seconds, "seconds": seconds, "succeeded": counts.get("succeeded", 0),
             "failed": counts.get("failed", 0), "results": len(results),
             "codes": sorted({failure["code"] for failure in run.ctx.failures}), "writes": run.writes[0]}
    saved = finish(runner, run)  # its flush is the write a checkpoint needs to be read back: not counted above
    found["checkpoint_done"] = saved.items_done if saved else 0
    found["checkpoint_failed"] = saved.counts[2] if saved and saved.counts else 0
    return found


def bare_items(n: int) -> dict[str, Any]:
    """A bare loop calling the same ``noop``, recording each outcome in a list: items/s and its counts."""
    gc.collect()
    outcomes: list[tuple[bool, Any]] = []
    began = time.perf_counter()
    for item in range(n):
        try:
            result = noop(item)
        except ItemError as exc:
            outcomes.append((False, exc.code))
        else:
            outcomes.append((True, result))
    seconds = time.perf_counter() - began
    failed = [code for ok, code in outcomes if not ok]
    return {"items_per_s": n / seconds, "seconds": seconds, "succeeded": len(outcomes) - len(failed),
            "failed": len(failed), "codes": sorted(set(failed))}


# -- per row ---------------------------------------------------------------------------------------------------


def export_rows(n: int) -> Iterator[tuple[Any, ...]]:
    """The export's rows, as orders.export makes them (its make_row, its dates spread over its default year)."""
    start, end = date_range(None, None)
    span = (end - start).days + 1
    for i in range(n):
        yield make_row(i, start + timedelta(days=i * span // n))


def bare_csv(path: Path, n: int) -> None:
    """A bare script's CSV: the same cells as the processor's (ISO dates, amounts in units), one writerow a row."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(HEADER)
        for code, day, customer, items, cents, cur, status in export_rows(n):
            writer.writerow((code, day.isoformat(), customer, items, f"{cents // 100}.{cents % 100:02d}", cur,
                             status))


def bare_xlsx(path: Path, n: int) -> None:
    """A bare script's XLSX: an openpyxl write-only workbook with the same sheet, saved to a path."""
    from openpyxl import Workbook

    book = Workbook(write_only=True)
    sheet = book.create_sheet("orders")
    sheet.append(HEADER)
    for code, day, customer, items, cents, cur, status in export_rows(n):
        sheet.append((code, day, customer, items, cents / 100, cur, status))
    book.save(path)


BARE_WRITERS: dict[str, Callable[[Path, int], None]] = {"csv": bare_csv, "xlsx": bare_xlsx}


def fingerprint(fh: BinaryIO, fmt: str) -> str:
    """What must be the same on both sides: a CSV's bytes, an XLSX sheet's XML (the zip's dates differ)."""
    with fh:
        if fmt == "csv":
            data = fh.read()
        else:
            with zipfile.ZipFile(fh) as book:
                data = book.read("xl/worksheets/sheet1.xml")
    return hashlib.sha256(data).hexdigest()


def taskport_export(runner: Runner, fmt: str, n: int) -> dict[str, Any]:
    """The orders.export processor on a started task, ``n`` rows in ``fmt``: rows/s, its file's size and print."""
    proc = processors.get("orders.export")
    assert proc is not None
    run = deliver(runner, "orders.export", proc.schema.load({"rows": n, "format": fmt}))
    gc.collect()
    began = time.perf_counter()
    output = proc.func(run.payload, run.ctx)
    seconds = time.perf_counter() - began
    found = {"rows_per_s": n / seconds, "seconds": seconds, "bytes": output["file"]["size"],
             "print": fingerprint(run.ctx.results.open(run.task_id, output["file"]["name"]), fmt),
             "writes": run.writes[0]}
    finish(runner, run)
    return found


def bare_export(folder: Path, fmt: str, n: int) -> dict[str, Any]:
    """The bare script for ``fmt``, writing ``n`` rows to a file in ``folder``: rows/s, size and print."""
    path = folder / f"bare.{fmt}"
    gc.collect()
    began = time.perf_counter()
    BARE_WRITERS[fmt](path, n)
    seconds = time.perf_counter() - began
    found = {"rows_per_s": n / seconds, "seconds": seconds, "bytes": path.stat().st_size,
             "print": fingerprint(path.open("rb"), fmt)}
    path.unlink()
    return found


# -- rounds ----------------------------------------------------------------------------------------------------


def variants(runner: Runner, scratch: Path, items: int, rows: int) -> dict[str, Callable[[], dict[str, Any]]]:
    """Every timed run of a round, by name; pairs side by side so that alternating the order is one reverse."""
    found: dict[str, Callable[[], dict[str, Any]]] = {
        "items.taskport": lambda: taskport_items(runner, items),
        "items.bare": lambda: bare_items(items),
        "items.no_checkpoints": lambda: taskport_items(runner, items, checkpoints=False),
    }
    for fmt in FORMATS:
        found[f"{fmt}.taskport"] = functools.partial(taskport_export, runner, fmt, rows)
        found[f"{fmt}.bare"] = functools.partial(bare_export, scratch, fmt, rows)
    return found


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' medians of every figure, the last run's other values (counts, prints), and each run's rate."""
    found = dict(runs[-1])
    for name, value in runs[0].items():
        if isinstance(value, float):
            found[name] = statistics.median(run[name] for run in runs)
    rate = "items_per_s" if "items_per_s" in found else "rows_per_s"
    found["rounds"] = [run[rate] for run in runs]
    found["same_outcomes_every_round"] = all(_outcome(run) == _outcome(runs[0]) for run in runs)
    return found


def paired_ratio(ours: list[dict[str, Any]], bare: list[dict[str, Any]]) -> float:
    """The median over the rounds of each round's ratio: the two runs of a pair are adjacent in time, so a
    machine shared with other work slows both alike, where a ratio of medians could take them from two rounds."""
    rate = "items_per_s" if "items_per_s" in ours[0] else "rows_per_s"
    return statistics.median(_ratio(o[rate], b[rate]) for o, b in zip(ours, bare, strict=True))


def _outcome(run: dict[str, Any]) -> tuple[Any, ...]:
    """What a run did, to compare across rounds: its counts, or its file's print (a CSV's bytes, an XLSX sheet's
    XML; not the file's size: an XLSX zip's dates make it vary by a byte from one save to the next)."""
    return tuple(run.get(k) for k in ("succeeded", "failed", "codes", "print"))


def rounds_of(timed: dict[str, Callable[[], dict[str, Any]]], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Every timed run ``rounds`` times, each round in the reverse order of the one before (who goes first
    alternates, so that a machine getting busier or quieter weighs on both sides of each pair alike)."""
    order = list(timed)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in order}
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            runs[name].append(timed[name]())
    return runs


def measure_on(runner: Runner, scratch: Path, rounds: int = 3, items: int = 100_000,
               rows: int = 200_000) -> dict[str, Any]:
    """The figures of ``measure`` through ``runner`` (its Redis, its result store), bare files in ``scratch``."""
    for run in variants(runner, scratch, min(items, WARM_UP), min(rows, WARM_UP)).values():
        run()  # warm-up: imports (openpyxl), the script cache, the allocator; not counted
    gc.freeze()  # what is alive now stays: each run's gc.collect() then scans only what the runs left
    try:
        runs = rounds_of(variants(runner, scratch, items, rows), rounds)
    finally:
        gc.unfreeze()
    med = {name: _median(found) for name, found in runs.items()}
    out: dict[str, Any] = {"rounds": rounds, "items": items, "rows": rows, "interval": runner.config.progress_interval}
    out["per_item"] = {"taskport": med["items.taskport"], "bare": med["items.bare"],
                       "no_checkpoints": med["items.no_checkpoints"],
                       "ratio": paired_ratio(runs["items.taskport"], runs["items.bare"]),
                       "ratio_no_checkpoints": paired_ratio(runs["items.no_checkpoints"], runs["items.bare"])}
    for fmt in FORMATS:
        ours, bare = med[f"{fmt}.taskport"], med[f"{fmt}.bare"]
        out[f"per_row_{fmt}"] = {"taskport": ours, "bare": bare,
                                 "ratio": paired_ratio(runs[f"{fmt}.taskport"], runs[f"{fmt}.bare"]),
                                 "identical": ours["print"] == bare["print"] and ours["same_outcomes_every_round"]
                                 and bare["same_outcomes_every_round"]}
    return out


def measure(rounds: int = 3, items: int = 100_000, rows: int = 200_000) -> dict[str, Any]:
    """Per-item and per-row overhead on a scratch embedded Redis (the module docstring says what and how)."""
    with tempfile.TemporaryDirectory(prefix="tp-overhead-") as tmp:
        base = Config.from_env({}, data_dir=Path(tmp) / "data")  # every other setting at its default
        with EmbeddedRedis(base) as server:
            config = replace(base, redis_url=server.url)
            runner = Runner(config, conn=server.client(timeout=10))
            scratch = Path(tmp) / "bare"
            scratch.mkdir()
            try:
                return measure_on(runner, scratch, rounds, items, rows)
            finally:
                runner.store.redis.close()


# -- the table -------------------------------------------------------------------------------------------------


def _per_unit_us(ours: float, bare: float) -> str:
    """What taskport adds per item or row, in microseconds of this machine."""
    return f"{(1 / ours - 1 / bare) * 1e6:+.2f} µs each" if ours and bare else ""


def _writes(n: int) -> str:
    return f"{n} progress write{'' if n == 1 else 's'} while timed"


def _items_detail(found: dict[str, Any]) -> str:
    return f"{found['succeeded']:,} ok, {found['failed']:,} failed with {found['codes']}, {_writes(found['writes'])}"


def item_rows(found: dict[str, Any], n: int, interval: float) -> list[Row]:
    ours, bare, off = found["taskport"], found["bare"], found["no_checkpoints"]
    same = (ours["succeeded"], ours["failed"], ours["codes"]) == (bare["succeeded"], bare["failed"], bare["codes"]) \
        and ours["same_outcomes_every_round"] and bare["same_outcomes_every_round"]
    name = (f"per item: ctx.each over {n:,} no-op items (1 % fail, ItemError {FAIL_CODE}), checkpoints on, "
            f"progress every {interval:g} s to Redis, vs a bare loop recording the same outcomes in a list")
    return [
        Row(name, f"{ours['items_per_s']:,.0f} items/s ({_items_detail(ours)})",
            f"{bare['items_per_s']:,.0f} items/s ({bare['succeeded']:,} ok, {bare['failed']:,} failed)",
            f"{found['ratio']:.2f}× ({_per_unit_us(ours['items_per_s'], bare['items_per_s'])}"
            f"{'' if same else '; OUTCOMES DIFFER'})", f"≥ {ITEMS_TARGET}×",
            _check(found["ratio"] >= ITEMS_TARGET and same)),
        Row("per item: the same without the checkpoint machinery (no per-item checkpoint bookkeeping, no "
            "checkpoint in the writes; for the record)", f"{off['items_per_s']:,.0f} items/s",
            f"{bare['items_per_s']:,.0f} items/s",
            f"{found['ratio_no_checkpoints']:.2f}× ({_per_unit_us(off['items_per_s'], bare['items_per_s'])})"),
    ]


def export_row(fmt: str, found: dict[str, Any], n: int) -> Row:
    ours, bare = found["taskport"], found["bare"]
    library = "csv.writer" if fmt == "csv" else "openpyxl write-only"
    same = "same bytes" if fmt == "csv" else "same sheet XML"
    return Row(f"per row: orders.export of {n:,} rows to {fmt.upper()}, progress included, local result store, "
               f"vs a bare script writing the same rows with {library} to a file",
               f"{ours['rows_per_s']:,.0f} rows/s ({ours['bytes']:,} B, {_writes(ours['writes'])})",
               f"{bare['rows_per_s']:,.0f} rows/s ({bare['bytes']:,} B)",
               f"{found['ratio']:.2f}× ({_per_unit_us(ours['rows_per_s'], bare['rows_per_s'])}; "
               f"{same if found['identical'] else 'OUTPUTS DIFFER'})", f"≥ {ROWS_TARGET}×",
               _check(found["ratio"] >= ROWS_TARGET and found["identical"]))


def rows(out: dict[str, Any]) -> list[Row]:
    """The bench table's rows of ``measure``'s figures: one a target, and the record's."""
    found = item_rows(out["per_item"], out["items"], out["interval"])
    return found + [export_row(fmt, out[f"per_row_{fmt}"], out["rows"]) for fmt in FORMATS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3); medians are shown")
    parser.add_argument("--items", type=int, default=100_000, help="items of the per-item runs (default 100000)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the per-row runs (default 200000)")
    args = parser.parse_args(argv)
    out = measure(args.rounds, args.items, args.rows)
    print(f"processor API overhead: {args.rounds} interleaved rounds, medians\n")
    print(markdown(rows(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
