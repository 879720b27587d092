"""The result store contract: every test runs against the disk store AND the S3 store (a real
S3-compatible server on loopback, tests/s3server.py), the way the task store's contract runs on
fakeredis and on a real Redis."""

from __future__ import annotations

import csv
import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core import processors
from app.core.results import (
    SPILLED_NAME,
    SPILLED_REF,
    FileInfo,
    LocalResultStore,
    ResultStore,
    spill,
    streamed_body,
    unspill,
)
from app.core.s3store import S3ResultStore
from tests.s3server import S3Server, use_s3
from workers.context import TaskContext

MIB = 1024 * 1024


@pytest.fixture(params=["file", "s3"])
def results(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultStore:
    if request.param == "file":
        return LocalResultStore(tmp_path / "results")
    server: S3Server = request.getfixturevalue("s3_server")
    use_s3(monkeypatch, server)
    return S3ResultStore(server.new_bucket(), "taskport/results", scratch=tmp_path / "scratch", part_size=5 * MIB)


@pytest.fixture
def task_id() -> str:
    return str(uuid.uuid4())


def test_round_trip(results: ResultStore, task_id: str) -> None:
    with results.writer(task_id, "out.csv") as fh:
        fh.write(b"a,b\n")
        fh.write(memoryview(b"1,2\n"))
    assert results.info(task_id, "out.csv", "text/csv") == FileInfo("out.csv", 8, "text/csv")
    with results.open(task_id, "out.csv") as fh:
        assert fh.read() == b"a,b\n1,2\n"


def test_a_file_appears_only_when_its_writer_exits_cleanly(results: ResultStore, task_id: str) -> None:
    with results.writer(task_id, "out.csv") as fh:
        fh.write(b"x" * 1000)
        with pytest.raises(FileNotFoundError):
            results.open(task_id, "out.csv")
    assert results.info(task_id, "out.csv", "").size == 1000


@pytest.mark.parametrize("size", [10, 11 * MIB], ids=["small", "multipart"])
def test_a_failed_write_leaves_nothing(results: ResultStore, task_id: str, size: int) -> None:
    with pytest.raises(RuntimeError):
        with results.writer(task_id, "out.csv") as fh:
            fh.write(b"p" * size)
            raise RuntimeError("stop")
    with pytest.raises(FileNotFoundError):
        results.open(task_id, "out.csv")
    if isinstance(results, S3ResultStore):
        assert results.client.list_multipart_uploads(Bucket=results.bucket).get("Uploads", []) == []


def test_a_rewrite_replaces(results: ResultStore, task_id: str) -> None:
    for content in (b"first", b"second"):
        with results.writer(task_id, "r.bin") as fh:
            fh.write(content)
    with results.open(task_id, "r.bin") as fh:
        assert fh.read() == b"second"


def test_missing_files_raise_file_not_found(results: ResultStore, task_id: str) -> None:
    with pytest.raises(FileNotFoundError):
        results.info(task_id, "nothing.csv", "")
    with pytest.raises(FileNotFoundError):
        results.open(task_id, "nothing.csv")


def test_a_large_file_streams_in_parts_and_reads_back(results: ResultStore, task_id: str) -> None:
    chunk = os.urandom(MIB)
    with results.writer(task_id, "big.bin") as fh:
        for _ in range(12):
            fh.write(chunk)
    assert results.info(task_id, "big.bin", "").size == 12 * MIB
    with results.open(task_id, "big.bin") as fh:
        for _ in range(12):
            assert fh.read(MIB) == chunk
        assert fh.read(1) == b""


def test_delete_removes_every_file_of_the_task_only_and_is_idempotent(results: ResultStore, task_id: str) -> None:
    other = str(uuid.uuid4())
    for tid, name in ((task_id, "a.csv"), (task_id, "b.csv"), (other, "a.csv")):
        with results.writer(tid, name) as fh:
            fh.write(b"1")
    results.delete(task_id)
    results.delete(task_id)
    results.delete(str(uuid.uuid4()))
    for name in ("a.csv", "b.csv"):
        with pytest.raises(FileNotFoundError):
            results.open(task_id, name)
    assert results.info(other, "a.csv", "").size == 1


def test_task_ids_are_listed_in_order_a_page_at_a_time(results: ResultStore) -> None:
    assert results.task_ids("", 10) == []
    ids = sorted(str(uuid.uuid4()) for _ in range(5))
    for tid in ids:
        for name in ("a.csv", "b.csv"):
            with results.writer(tid, name) as fh:
                fh.write(b"1")
    assert results.task_ids("", 2) == ids[:2]
    assert results.task_ids(ids[1], 2) == ids[2:4]
    assert results.task_ids(ids[3], 2) == ids[4:]
    assert results.task_ids(ids[4], 2) == []


def test_task_ids_skips_what_is_no_task_folder(results: ResultStore, task_id: str) -> None:
    """Whatever else shares the store's place (an operator's note, lost+found) is never handed to the sweep."""
    if isinstance(results, S3ResultStore):
        for key in ("lost+found/x", "notes.txt"):
            results.client.put_object(Bucket=results.bucket, Key=results.prefix + key, Body=b"x")
    else:
        assert isinstance(results, LocalResultStore)
        (results.root / "lost+found").mkdir(parents=True)
        (results.root / "notes.txt").write_bytes(b"x")
    with results.writer(task_id, "a.csv") as fh:
        fh.write(b"1")
    assert results.task_ids("", 10) == [task_id]
    assert results.task_ids("", 1) == [task_id]


@pytest.mark.parametrize(("tid", "name"), [
    ("../etc", "a.csv"), ("not-a-uuid", "a.csv"), (str(uuid.uuid4()).upper(), "a.csv"),
    ("TASK", "../x"), ("TASK", ".hidden"), ("TASK", "a/b"), ("TASK", ""),
])
def test_ids_and_names_are_checked_before_anything_is_written(results: ResultStore, tid: str, name: str) -> None:
    tid = str(uuid.uuid4()) if tid == "TASK" else tid
    with pytest.raises(ValueError):
        results.writer(tid, name)
    with pytest.raises(ValueError):
        results.open(tid, name)
    assert results.task_ids("", 10) == []


def test_a_writer_names_a_local_folder_for_scratch_files_that_goes_with_the_task(
        results: ResultStore, task_id: str) -> None:
    with results.writer(task_id, "out.xlsx") as fh:
        folder = Path(fh.name).parent  # type: ignore[arg-type]
        assert folder.is_dir()
        (folder / "tmp-sheet.xml").write_bytes(b"scratch")
        fh.write(b"zip")
    results.delete(task_id)
    assert not (folder / "tmp-sheet.xml").exists()


def test_spill_keeps_small_results_and_stores_large_ones(results: ResultStore, task_id: str) -> None:
    assert spill(results, task_id, {"n": 1}, limit=100) == {"n": 1}
    assert results.task_ids("", 10) == []
    big = {"rows": list(range(1000))}
    ref = spill(results, task_id, big, limit=100)
    assert ref[SPILLED_REF] == SPILLED_NAME and ref["size"] > 100
    assert unspill(results, task_id, {"result": ref, "failures": []}) == {"result": big, "failures": []}
    assert unspill(results, task_id, {"result": {"n": 1}}) == {"result": {"n": 1}}
    results.delete(task_id)
    with pytest.raises(FileNotFoundError):
        unspill(results, task_id, {"result": ref})


@pytest.fixture
def ctx(results: ResultStore, task_id: str) -> Iterator[TaskContext]:
    processors.load()
    yield TaskContext(task_id, lambda *a: "PROCESSING", results=results, interval=0)


@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_the_export_processor_writes_through_either_store(ctx: TaskContext, fmt: str) -> None:
    proc = processors.get("orders.export")
    assert proc is not None
    out = proc.func(processors.validate("orders.export", {"rows": 2500, "format": fmt}), ctx)
    info = ctx.results.info(ctx.task_id, out["file"]["name"], "")
    assert info.size == out["file"]["size"] > 0
    with ctx.results.open(ctx.task_id, out["file"]["name"]) as fh:
        data = fh.read()
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
        assert len(rows) == 2501 and rows[-1][0] == "ORD-0002500"
    else:
        from openpyxl import load_workbook

        sheet = load_workbook(io.BytesIO(data), read_only=True)["orders"]
        rows = list(sheet.iter_rows(values_only=True))
        assert len(rows) == 2501 and rows[-1][0] == "ORD-0002500"


def test_a_download_body_streams_an_object_in_blocks_and_closes_it(results: ResultStore, task_id: str) -> None:
    with results.writer(task_id, "out.bin") as fh:
        fh.write(b"y" * (3 * MIB + 5))
    handle = results.open(task_id, "out.bin")
    body = streamed_body(handle)
    if isinstance(results, LocalResultStore):
        assert body is None  # a file on disk goes through the WSGI file wrapper (sendfile)
        handle.close()
        return
    assert body is not None
    assert [len(b) for b in body] == [MIB, MIB, MIB, 5]
    body.close()


def test_closing_a_download_body_closes_its_stream_even_unread() -> None:
    stream = io.BytesIO(b"abc")  # no fileno, like an object store's stream
    body = streamed_body(stream)
    assert body is not None
    body.close()  # what the WSGI server does after a HEAD, or when the client went away
    assert stream.closed
