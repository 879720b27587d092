"""LocalResultStore: atomic writes, reads, idempotent delete, no path traversal."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.core.config import Config
from app.core.results import FileInfo, LocalResultStore, ResultStore, result_store


@pytest.fixture
def store(tmp_path: Path) -> LocalResultStore:
    return LocalResultStore(tmp_path / "results")


@pytest.fixture
def task_id() -> str:
    return str(uuid.uuid4())


def test_write_is_atomic(store: LocalResultStore, task_id: str):
    final = store.root / task_id / "out.csv"
    with store.writer(task_id, "out.csv") as fh:
        fh.write(b"a,b\n")
        assert not final.exists()
    assert final.read_bytes() == b"a,b\n"
    assert [p.name for p in final.parent.iterdir()] == ["out.csv"]


def test_failed_write_leaves_nothing(store: LocalResultStore, task_id: str):
    with pytest.raises(RuntimeError):
        with store.writer(task_id, "out.csv") as fh:
            fh.write(b"partial")
            raise RuntimeError("stop")
    assert list((store.root / task_id).iterdir()) == []
    with pytest.raises(FileNotFoundError):
        store.open(task_id, "out.csv")


def test_rewrite_replaces(store: LocalResultStore, task_id: str):
    for content in (b"first", b"second"):
        with store.writer(task_id, "r.bin") as fh:
            fh.write(content)
    with store.open(task_id, "r.bin") as fh:
        assert fh.read() == b"second"


def test_info_and_open(store: LocalResultStore, task_id: str):
    with store.writer(task_id, "data.csv") as fh:
        fh.write(b"12345")
    assert store.info(task_id, "data.csv", "text/csv") == FileInfo("data.csv", 5, "text/csv")
    with store.open(task_id, "data.csv") as fh:
        assert fh.read() == b"12345"
    with pytest.raises(FileNotFoundError):
        store.info(task_id, "other.csv", "text/csv")
    with pytest.raises(FileNotFoundError):
        store.open(str(uuid.uuid4()), "data.csv")


def test_delete_is_idempotent_and_per_task(store: LocalResultStore, task_id: str):
    other = str(uuid.uuid4())
    for tid in (task_id, other):
        with store.writer(tid, "f.txt") as fh:
            fh.write(b"x")
    store.delete(task_id)
    store.delete(task_id)
    assert not (store.root / task_id).exists()
    assert store.info(other, "f.txt", "text/plain").size == 1
    store.delete(str(uuid.uuid4()))  # never written: fine


BAD_IDS = [
    "",
    "..",
    "../x",
    "abc",
    "2F1C6A0E-8A53-4C1E-9D6B-0B2A4C1F7E21",
    "2f1c6a0e8a534c1e9d6b0b2a4c1f7e21",
    "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21/..",
    "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21\n",
]
BAD_NAMES = ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "/etc/passwd", "a\x00b", "x" * 200]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_rejects_bad_task_ids(store: LocalResultStore, bad: str):
    with pytest.raises(ValueError):
        store.writer(bad, "f.csv")
    with pytest.raises(ValueError):
        store.open(bad, "f.csv")
    with pytest.raises(ValueError):
        store.info(bad, "f.csv", "text/csv")
    with pytest.raises(ValueError):
        store.delete(bad)


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_rejects_bad_names(store: LocalResultStore, task_id: str, bad: str):
    with pytest.raises(ValueError):
        store.writer(task_id, bad)
    with pytest.raises(ValueError):
        store.open(task_id, bad)
    assert not store.root.exists()


def test_factory_uses_results_dir(tmp_path: Path):
    store = result_store(Config(data_dir=tmp_path))
    assert isinstance(store, LocalResultStore)
    assert store.root == tmp_path / "results"
    checked: ResultStore = store  # LocalResultStore satisfies the protocol (mypy checks this line)
    assert checked is store


def read(store: LocalResultStore, task_id: str) -> bytes:
    with store.open(task_id, "out.csv") as fh:
        return fh.read()


def test_a_run_writes_and_removes_only_its_own_folder(store: LocalResultStore, task_id: str):
    old, new = store.for_run("a" * 32), store.for_run("b" * 32)
    with old.writer(task_id, "out.csv") as fh:
        fh.write(b"old")
    with new.writer(task_id, "out.csv") as fh:
        fh.write(b"new")
    assert old.has_files(task_id) and new.has_files(task_id) and not store.for_run("c" * 32).has_files(task_id)
    old.delete(task_id)  # a run taken over leaves: the other run's file stays
    assert read(new, task_id) == b"new" and not old.has_files(task_id)
    with old.writer(task_id, "out.csv") as fh:
        fh.write(b"old again")
    new.prune(task_id)  # the later run removes what earlier runs left
    assert not old.has_files(task_id) and read(new, task_id) == b"new"
    store.delete(task_id)  # the task's own view removes every run's folder
    assert not new.has_files(task_id) and not (store.root / task_id).exists()
    for bad in ("../x", "A" * 32, "a" * 31):
        with pytest.raises(ValueError):
            store.for_run(bad)
    with pytest.raises(ValueError):
        store.prune(task_id)


def test_the_stores_depend_one_way_results_on_s3store_never_back() -> None:
    """results imports s3store (its factory); s3store takes the shared pieces from resultbase, not results."""
    tree = ast.parse((Path(__file__).resolve().parents[2] / "app" / "core" / "s3store.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    assert "app.core.results" not in imported and "app.core.resultbase" in imported


# -- resumable writers on disk (the contract's tests run on both stores) -------------------------------------


class Stop(Exception):
    pass


def partials(store: LocalResultStore, task_id: str) -> list[str]:
    return sorted(p.name for p in (store.root / task_id).iterdir() if p.name.endswith(".partial"))


def stopped_at(store: LocalResultStore, task_id: str, data: bytes) -> Any:
    """The token of a writer stopped gracefully after writing ``data``."""
    with pytest.raises(Stop), store.resumable(task_id, "out.csv", keep_on=(Stop,)) as fh:
        fh.write(data)
        size, token = fh.durable()
        assert size == len(data)
        raise Stop
    return token


def test_a_resumable_file_is_a_hidden_partial_until_it_is_finished(store: LocalResultStore, task_id: str):
    with store.resumable(task_id, "out.csv") as fh:
        fh.write(b"a,b\n")
        size, token = fh.durable()
        assert (size, sorted(token)) == (4, ["partial", "size"])
        assert partials(store, task_id) == [f".out.csv.{token['partial']}.partial"] == [Path(fh.name).name]
        assert not (store.root / task_id / "out.csv").exists()
    assert [p.name for p in (store.root / task_id).iterdir()] == ["out.csv"]


def test_the_next_run_takes_the_partial_over_under_a_name_of_its_own(store: LocalResultStore, task_id: str):
    """A run that was taken over and wakes up can then neither remove nor finish the file the next run writes."""
    token = stopped_at(store, task_id, b"0123456789")
    old = store.root / task_id / f".out.csv.{token['partial']}.partial"
    with store.resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 10 and not old.exists() and partials(store, task_id) == [Path(fh.name).name]
        old.unlink(missing_ok=True)  # what the old run's cleanup does
        fh.resume_at(4)
        fh.write(b"456789!")
    assert (store.root / task_id / "out.csv").read_bytes() == b"0123456789!"


def test_bytes_after_the_durable_offset_are_cut_and_a_shorter_file_starts_over(store: LocalResultStore,
                                                                                  task_id: str):
    token = stopped_at(store, task_id, b"0123456789")
    path = store.root / task_id / f".out.csv.{token['partial']}.partial"
    with path.open("ab") as fh:
        fh.write(b"written after the last save, maybe never synced")
    with store.resumable(task_id, "out.csv", token) as resumed:
        assert resumed.resumed == 10 and resumed.tell() == 10
        resumed.write(b"!")
    assert (store.root / task_id / "out.csv").read_bytes() == b"0123456789!"
    token = stopped_at(store, task_id, b"0123456789")
    (store.root / task_id / f".out.csv.{token['partial']}.partial").write_bytes(b"0123")
    with store.resumable(task_id, "out.csv", token) as resumed:
        assert resumed.resumed == 0 and resumed.tell() == 0
        resumed.write(b"new")
    assert (store.root / task_id / "out.csv").read_bytes() == b"new" and partials(store, task_id) == []


def test_partials_no_token_names_are_removed_when_a_writer_opens(store: LocalResultStore, task_id: str):
    """A crash before the first cursor save leaves a partial the next run cannot name: it goes."""
    stopped_at(store, task_id, b"lost")
    stopped_at(store, task_id, b"lost too")  # opening removed the first one
    other = store.root / task_id / ".other.csv.0123456789abcdef0123456789abcdef.partial"
    other.write_bytes(b"another file's")
    assert len(partials(store, task_id)) == 2
    with store.resumable(task_id, "out.csv") as fh:
        assert partials(store, task_id) == sorted([Path(fh.name).name, other.name])
        fh.write(b"x")
    assert partials(store, task_id) == [other.name]


def test_a_token_never_names_a_file_outside_the_folder(store: LocalResultStore, task_id: str, tmp_path: Path):
    victim = tmp_path / "victim.partial"
    victim.write_bytes(b"keep me")
    for name in ("../../victim", "0" * 31 + "/", "0" * 32 + "/../../../victim"):
        with store.resumable(task_id, "out.csv", {"partial": name, "size": 3}) as fh:
            assert fh.resumed == 0
    assert victim.read_bytes() == b"keep me"


def test_a_run_view_resumes_in_its_own_folder(store: LocalResultStore, task_id: str):
    run = store.for_run("a" * 32)
    with pytest.raises(Stop), run.resumable(task_id, "out.csv", keep_on=(Stop,)) as fh:
        fh.write(b"abc")
        token = fh.durable()[1]
        raise Stop
    assert partials(store, task_id) == []  # not in the task's folder: in the run's
    with store.for_run("a" * 32).resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 3
    with store.for_run("b" * 32).resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 0  # another run's folder holds no such partial
