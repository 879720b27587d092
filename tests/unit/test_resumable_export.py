"""``orders.export`` resumes a CSV export (issue 18): a run stopped halfway (gracefully, or killed outright),
then a second run on the same results folder with the checkpoint the first saved; the file is byte-identical
to an uninterrupted export's, on disk and on S3 (moto's server, parts of 5 MiB). The end-to-end test with a
real worker and a real kill is the integration suite's; these drive the processor through TaskContext."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest

from app.core import processors
from app.core.ids import new_run_id
from app.core.results import LocalResultStore, ResultStore
from app.core.s3store import S3ResultStore
from tests.s3server import S3Server, use_s3
from tests.unit.recorder import Recorder
from workers.checkpoint import Resume, Saved
from workers.context import TaskContext
from workers.exceptions import TaskCancelled, TaskInterrupted
from workers.processors import orders_export

ROWS = 200_000  # 11,058,399 bytes: two 5 MiB parts and a last one on S3
MIB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]
NAME = "orders_2026-01-01_2026-12-31.csv"


@pytest.fixture(params=["file", "s3"])
def results(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultStore:
    """One run's view of a store, the view the runner hands every run that resumes this one."""
    if request.param == "file":
        return LocalResultStore(tmp_path / "results").for_run(new_run_id())
    server: S3Server = request.getfixturevalue("s3_server")
    use_s3(monkeypatch, server)
    store = S3ResultStore(server.new_bucket(), "taskport/results", scratch=tmp_path / "scratch", part_size=5 * MIB)
    return store.for_run(new_run_id())


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, bytes]:
    """An uninterrupted export of ROWS rows: its result and its bytes."""
    processors.load()
    return uninterrupted(ROWS, tmp_path_factory.mktemp("whole"))


def uninterrupted(rows: int, tmp_path: Path) -> tuple[dict, bytes]:
    ctx = TaskContext(str(uuid.uuid4()), Recorder(), results=LocalResultStore(tmp_path / "whole"))
    result = export(ctx, rows=rows)
    with ctx.results.open(ctx.task_id, NAME) as fh:
        return result, fh.read()


@pytest.fixture(autouse=True)
def loaded() -> None:
    processors.load()  # the contexts here write with interval 0: a cursor save after every chunk


def export(ctx: TaskContext, fmt: str = "csv", rows: int = ROWS) -> dict:
    proc = processors.get("orders.export")
    assert proc is not None
    return proc.func(processors.validate("orders.export", {"rows": rows, "format": fmt}), ctx)


class Rows:
    """Counts the rows made, and stops the run (as a worker's SIGTERM does) when row ``stop`` is made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        self.stops: dict[int, TaskContext] = {}
        real = orders_export.make_row

        def make_row(index: int, day: date) -> orders_export.Row:
            self.made += 1
            if index in self.stops:
                self.stops.pop(index).mark_interrupted()
            return real(index, day)

        monkeypatch.setattr(orders_export, "make_row", make_row)


def checkpoint(report: Recorder) -> Resume | None:
    """What the progress script would hand the next run after ``report``'s writes (only a cursor here)."""
    cursors = [s.cursor for s in report.saved if isinstance(s, Saved) and s.cursor is not None]
    return Resume.parse(None, cursors[-1]) if cursors else None


def stopped(results: ResultStore, task_id: str, rows: Rows, at: int, resume: Resume | None = None,
            report: Recorder | None = None, total: int = ROWS) -> Resume | None:
    """Run the export until the stop at row ``at``, flush as the runner does, and return the checkpoint."""
    report = report or Recorder()
    ctx = TaskContext(task_id, report, results=results, interval=0, resume=resume)
    rows.stops[at] = ctx
    with pytest.raises(TaskInterrupted):
        export(ctx, rows=total)
    ctx.flush()
    with pytest.raises(FileNotFoundError):
        results.open(task_id, NAME)  # nothing under the final name yet
    return checkpoint(report)


def unfinished(results: ResultStore, task_id: str) -> int:
    """How many unfinished files the run's folder holds (partials on disk, multipart uploads on S3)."""
    if isinstance(results, S3ResultStore):
        listed = results.client.list_multipart_uploads(Bucket=results.bucket).get("Uploads", [])
        return sum(task_id in u["Key"] for u in listed)
    assert isinstance(results, LocalResultStore)
    folder = results.root / task_id / f"run-{results.run_id}"
    return sum(p.name.endswith(".partial") for p in folder.iterdir()) if folder.exists() else 0


def finished(results: ResultStore, task_id: str, resume: Resume | None, report: Recorder | None = None,
             total: int = ROWS) -> dict:
    ctx = TaskContext(task_id, report or Recorder(), results=results, interval=0, resume=resume)
    return export(ctx, rows=total)


def read(results: ResultStore, task_id: str) -> bytes:
    with results.open(task_id, NAME) as fh:
        return fh.read()


def test_a_csv_export_stopped_halfway_resumes_and_is_byte_identical(
        results: ResultStore, expected: tuple[dict, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    task_id, rows, before = str(uuid.uuid4()), Rows(monkeypatch), Recorder()
    resume = stopped(results, task_id, rows, ROWS // 2, report=before)
    assert resume is not None and unfinished(results, task_id) == 1
    cursor = resume.cursor
    if isinstance(results, LocalResultStore):
        assert cursor["row"] == ROWS // 2 + orders_export.CHUNK_ROWS  # the chunk being made when the stop came
    else:  # the last row boundary within the first 5 MiB part, the one finished part
        assert cursor["byte"] <= 5 * MIB < cursor["byte"] + 60_000 and len(cursor["file"]["parts"]) == 1
    rows.made = 0
    report = Recorder()
    assert finished(results, task_id, resume, report) == expected[0]
    assert read(results, task_id) == expected[1]
    assert rows.made == ROWS - cursor["row"]  # none of the rows before the cursor made again
    assert report.messages[0] == f"row {cursor['row'] + orders_export.CHUNK_ROWS} of {ROWS}"
    assert unfinished(results, task_id) == 0
    if isinstance(results, LocalResultStore):  # the stop saved every row written: progress goes on from there
        assert report.calls[0][0] is not None and report.calls[0][0] >= max(c[0] or 0 for c in before.calls)
    # on S3 the rows after the last finished part are made again; the progress script keeps the stored
    # percentage from going down (app.core.scripts)


def test_a_run_stopped_twice_resumes_twice(results: ResultStore, expected: tuple[dict, bytes],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    task_id, rows = str(uuid.uuid4()), Rows(monkeypatch)
    first = stopped(results, task_id, rows, 100_000)
    second = stopped(results, task_id, rows, 190_000, first)
    assert first is not None and second is not None and second.cursor["row"] > first.cursor["row"]
    assert finished(results, task_id, second) == expected[0]
    assert read(results, task_id) == expected[1]


@pytest.mark.parametrize("results", ["s3"], indirect=True)
def test_a_stop_before_a_part_is_finished_on_s3_saves_no_cursor_and_starts_over(
        results: ResultStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """20,000 rows (1.1 MB) never fill a 5 MiB part: nothing is durable, so there is no cursor to save (on disk
    every row written is durable)."""
    task_id, rows = str(uuid.uuid4()), Rows(monkeypatch)
    resume = stopped(results, task_id, rows, 10_000, total=20_000)
    assert resume is None and unfinished(results, task_id) == 0
    result = finished(results, task_id, resume, total=20_000)
    assert (result, read(results, task_id)) == uninterrupted(20_000, tmp_path)


def test_a_cursor_whose_file_is_gone_starts_over_from_row_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    results, task_id, rows = LocalResultStore(tmp_path).for_run(new_run_id()), str(uuid.uuid4()), Rows(monkeypatch)
    resume = stopped(results, task_id, rows, 10_000, total=20_000)
    assert resume is not None
    results.delete(task_id)  # the run's folder went (a retry's cleanup, an operator)
    rows.made = 0
    result = finished(results, task_id, resume, total=20_000)
    assert rows.made == 20_000
    assert (result, read(results, task_id)) == uninterrupted(20_000, tmp_path)


def test_a_cancel_during_the_stop_leaves_nothing(results: ResultStore, monkeypatch: pytest.MonkeyPatch) -> None:
    task_id, rows = str(uuid.uuid4()), Rows(monkeypatch)
    ctx = TaskContext(task_id, Recorder(), results=results, interval=0)
    rows.stops[ROWS // 2] = ctx
    real = ctx.mark_interrupted

    def stop_and_cancel() -> None:
        real()
        ctx.mark_cancelled()  # the heartbeat learnt of a cancel meanwhile: the cancel wins over the stop

    monkeypatch.setattr(ctx, "mark_interrupted", stop_and_cancel)
    with pytest.raises(TaskCancelled) as caught:
        export(ctx)
    assert type(caught.value) is TaskCancelled and unfinished(results, task_id) == 0


def test_xlsx_ignores_a_cursor_and_an_interrupted_one_leaves_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from openpyxl import load_workbook

    results, task_id, rows = LocalResultStore(tmp_path).for_run(new_run_id()), str(uuid.uuid4()), Rows(monkeypatch)
    report = Recorder()
    ctx = TaskContext(task_id, report, results=results, interval=0)
    rows.stops[1500] = ctx
    with pytest.raises(TaskInterrupted):
        export(ctx, "xlsx", 3000)
    ctx.flush()
    assert checkpoint(report) is None and not results.has_files(task_id)
    cursor = {"row": 2000, "byte": 10, "file": {"partial": "0" * 32, "size": 10}}
    ctx = TaskContext(task_id, Recorder(), results=results, interval=0, resume=Resume(cursor=cursor))
    name = export(ctx, "xlsx", 3000)["file"]["name"]
    with results.open(task_id, name) as fh:
        book = load_workbook(fh, read_only=True)
        assert len(list(book["orders"].iter_rows(values_only=True))) == 3001
        book.close()


# A worker killed outright (kill -9): no cleanup, no final save; the cursors come from the report calls
# before the kill, written to a file as the progress script would keep the last one.
KILLED = """
import json, os, sys
from pathlib import Path
from app.core import processors
from app.core.results import LocalResultStore
from app.core.s3store import S3ResultStore
from workers.context import TaskContext
from workers.processors import orders_export

args = json.loads(sys.argv[1])
processors.load()
if args["bucket"]:
    store = S3ResultStore(args["bucket"], "taskport/results", scratch=Path(args["root"]), part_size=5 * 1024 * 1024)
else:
    store = LocalResultStore(args["root"])
results = store.for_run(args["run_id"])
cursors = open(args["cursors"], "ab")

def report(progress, message, items, saved=None):
    if saved is not None and saved.cursor is not None:
        cursors.write(saved.cursor + b"\\n")
        cursors.flush()
    return "PROCESSING"

real = orders_export.make_row
def make_row(index, day):
    if index == args["kill"]:
        os._exit(137)
    return real(index, day)
orders_export.make_row = make_row
ctx = TaskContext(args["task_id"], report, results=results, interval=0)
processors.get("orders.export").func(processors.validate("orders.export", {"rows": args["rows"]}), ctx)
"""


def test_an_export_killed_outright_resumes_from_its_last_saved_cursor(
        results: ResultStore, expected: tuple[dict, bytes], tmp_path: Path) -> None:
    task_id, cursors = str(uuid.uuid4()), tmp_path / "cursors"
    s3 = isinstance(results, S3ResultStore)
    if isinstance(results, S3ResultStore):  # the child reaches the server through the variables use_s3 set
        where = {"bucket": results.bucket, "root": str(results.scratch), "run_id": results.run_id}
    else:
        assert isinstance(results, LocalResultStore)
        where = {"bucket": None, "root": str(results.root), "run_id": results.run_id}
    args = {**where, "task_id": task_id, "rows": ROWS, "kill": 150_000, "cursors": str(cursors)}
    child = subprocess.run([sys.executable, "-c", KILLED, json.dumps(args)], cwd=ROOT, capture_output=True,
                           timeout=60)
    assert child.returncode == 137, child.stderr.decode()
    last = cursors.read_bytes().splitlines()[-1]
    resume = Resume.parse(None, last)
    assert resume is not None and resume.cursor["row"] >= (90_000 if s3 else 149_000)
    assert finished(results, task_id, resume) == expected[0]
    assert hashlib.sha256(read(results, task_id)).digest() == hashlib.sha256(expected[1]).digest()
