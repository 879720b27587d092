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
from typing import Any

import pytest

from app.core import processors
from app.core.filebody import streamed_body
from app.core.results import (
    SPILLED_NAME,
    SPILLED_REF,
    FileInfo,
    LocalResultStore,
    ResultStore,
    remove_runs,
    spill,
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


def test_runs_lists_the_run_folders_of_the_task_and_remove_runs_removes_those_named(results: ResultStore,
                                                                                    task_id: str) -> None:
    first, second, third = sorted(uuid.uuid4().hex for _ in range(3))
    assert results.runs(task_id) == []
    for run in (first, second, third):
        with results.for_run(run).writer(task_id, "a.csv") as fh:
            fh.write(b"1")
    with results.writer(task_id, "legacy.csv") as fh:  # a file of the task's own folder is no run's
        fh.write(b"1")
    assert results.runs(task_id) == [first, second, third]
    remove_runs(results, task_id, [first, third])
    assert results.runs(task_id) == [second] and results.for_run(second).info(task_id, "a.csv", "").size == 1
    assert results.info(task_id, "legacy.csv", "").size == 1


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


# -- resumable writers: what a run leaves for the next (issue 18) -------------------------------------------


class Stop(Exception):
    """Stands for TaskInterrupted (the core knows no worker exceptions): what a graceful stop raises."""


def records(size: int, total: int) -> list[bytes]:
    """Deterministic records of ``size`` bytes (the rows of an export), ``total`` bytes in all."""
    return [(f"{i:09d}," * (size // 10 + 1)).encode()[:size - 1] + b"\n" for i in range(-(-total // size))]


def interrupted(results: ResultStore, task_id: str, parts: list[bytes], stop_at: int) -> tuple[int, Any]:
    """Write ``parts`` until ``stop_at`` bytes are written, then stop the way a graceful stop does; return the
    boundary a processor would save (the last record end at or before the durable bytes) and the token."""
    ends, written = [0], 0
    with pytest.raises(Stop), results.resumable(task_id, "out.csv", keep_on=(Stop,)) as fh:
        for part in parts:
            fh.write(part)
            written += len(part)
            ends.append(written)
            if written >= stop_at:
                durable, token = fh.durable()
                assert durable <= fh.tell() == written
                raise Stop
    return max(end for end in ends if end <= durable), token


def resumed(results: ResultStore, task_id: str, parts: list[bytes], boundary: int, token: Any) -> int:
    """Continue from ``boundary`` with ``token`` as a processor does; return where the writer resumed."""
    with results.resumable(task_id, "out.csv", token, keep_on=(Stop,)) as fh:
        start = boundary if 0 < boundary <= fh.resumed else 0
        fh.resume_at(start)
        written = 0
        for part in parts:
            if written >= start:
                fh.write(part)
            written += len(part)
        assert fh.tell() == written
        return fh.resumed


def stored(results: ResultStore, task_id: str) -> bytes:
    with results.open(task_id, "out.csv") as fh:
        return fh.read()


def left_behind(results: ResultStore, task_id: str) -> list[str]:
    """What the task's writers left unfinished: partial files on disk, multipart uploads on S3."""
    if isinstance(results, S3ResultStore):
        listed = results.client.list_multipart_uploads(Bucket=results.bucket).get("Uploads", [])
        return [u["Key"] for u in listed if task_id in u["Key"]]
    assert isinstance(results, LocalResultStore)
    folder = results.root / task_id
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial")) if folder.exists() else []


# (record size, bytes written before the stop), with S3 parts of 5 MiB: nothing durable on S3 yet; within the
# second part (a record straddles the part boundary, so the writer skips the bytes the part already holds);
# exactly on a part boundary (nothing in the buffer); everything written but not finished.
STOPS = [(1000, 3 * MIB), (1000, 7 * MIB), (1024, 5 * MIB), (1000, 11 * MIB)]


@pytest.mark.parametrize(("size", "stop_at"), STOPS, ids=["nothing-durable", "mid-part", "on-part-boundary", "all"])
def test_an_interrupted_file_resumes_byte_identical(results: ResultStore, task_id: str, size: int,
                                                    stop_at: int) -> None:
    parts = records(size, 11 * MIB)
    boundary, token = interrupted(results, task_id, parts, stop_at)
    assert len(left_behind(results, task_id)) == (0 if token is None else 1)  # kept for the next run
    with pytest.raises(FileNotFoundError):
        results.open(task_id, "out.csv")  # nothing under the final name while it is unfinished
    at = resumed(results, task_id, parts, boundary, token)
    if isinstance(results, LocalResultStore):
        assert at == boundary == stop_at // size * size + (size if stop_at % size else 0)  # synced: all of it
    else:
        assert at == stop_at // (5 * MIB) * 5 * MIB and boundary <= at < boundary + size
    assert stored(results, task_id) == b"".join(parts)
    assert left_behind(results, task_id) == []


def test_a_crash_leaves_what_is_durable_for_the_next_run(results: ResultStore, task_id: str) -> None:
    """A killed process runs no cleanup at all: here, the writer is entered and never exited."""
    parts = records(1000, 8 * MIB)
    writing = results.resumable(task_id, "out.csv")
    fh = writing.__enter__()
    for part in parts[:6000]:
        fh.write(part)
    durable, token = fh.durable()
    assert durable == (6_000_000 if isinstance(results, LocalResultStore) else 5 * MIB)
    del writing, fh
    boundary = durable // 1000 * 1000
    assert resumed(results, task_id, parts, boundary, token) == durable
    assert stored(results, task_id) == b"".join(parts)


def test_durable_never_counts_more_than_was_written(results: ResultStore, task_id: str) -> None:
    with results.resumable(task_id, "out.csv") as fh:
        assert fh.resumed == 0 and fh.durable() == (0, None)  # nothing yet: no token
        seen = []
        for part in records(1000, 6 * MIB):
            fh.write(part)
            durable, token = fh.durable() if len(seen) % 500 == 0 else seen[-1]
            assert durable <= fh.tell() and (token is None) == (durable == 0)
            seen.append((durable, token))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("token", [
    "garbage", 7, {"partial": "../../../etc/passwd", "size": 3}, {"partial": "0" * 32, "size": -1},
    {"upload": "no-such-upload", "parts": [['"etag"', 5 * MIB]]}, {"upload": "x", "parts": "1"},
], ids=["text", "number", "path", "negative", "no-upload", "bad-parts"])
def test_a_token_that_matches_nothing_starts_over(results: ResultStore, task_id: str, token: Any) -> None:
    with results.resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 0
        fh.resume_at(0)
        fh.write(b"fresh")
    assert stored(results, task_id) == b"fresh"


def test_a_token_of_a_file_removed_or_finished_since_starts_over(results: ResultStore, task_id: str) -> None:
    parts = records(1000, 6 * MIB)
    boundary, token = interrupted(results, task_id, parts, 6 * MIB)
    results.delete(task_id)  # e.g. a cancel's cleanup, or a retry's
    assert resumed(results, task_id, parts, boundary, token) == 0
    assert stored(results, task_id) == b"".join(parts)
    boundary, token = interrupted(results, task_id, parts, 6 * MIB)
    assert resumed(results, task_id, parts, boundary, token) > 0
    assert resumed(results, task_id, parts[:10], boundary, token) == 0  # that token's file is the final file now
    assert stored(results, task_id) == b"".join(parts[:10])


def test_any_other_exception_removes_the_unfinished_file(results: ResultStore, task_id: str) -> None:
    parts = records(1000, 6 * MIB)
    with pytest.raises(RuntimeError), results.resumable(task_id, "out.csv", keep_on=(Stop,)) as fh:
        for part in parts:
            fh.write(part)
        token = fh.durable()[1]
        raise RuntimeError("failed")  # a failure, a cancel, a timeout: nothing is kept
    assert left_behind(results, task_id) == []
    with results.resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 0


def test_resume_at_comes_first_and_goes_no_further_than_what_was_resumed(results: ResultStore,
                                                                          task_id: str) -> None:
    boundary, token = interrupted(results, task_id, records(1000, 6 * MIB), 6 * MIB)
    with results.resumable(task_id, "out.csv", token) as fh:
        with pytest.raises(ValueError):
            fh.resume_at(fh.resumed + 1)
        fh.write(b"x")
        with pytest.raises(ValueError):
            fh.resume_at(0)
    with results.resumable(task_id, "out.csv") as fh, pytest.raises(ValueError):
        fh.resume_at(1)
