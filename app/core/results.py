"""Result files (exports, large JSON results) behind a small storage interface.

Processors write files through ``ResultStore.writer``; the API streams them back with ``open``;
housekeeping and cancellation remove them with ``delete``, and housekeeping's orphan sweep walks
``task_ids``. :class:`LocalResultStore` keeps them on disk, one folder per task under
``Config.results_dir``; :class:`app.core.s3store.S3ResultStore` keeps them in an S3-compatible bucket.
:func:`result_store` returns the one ``TASKPORT_RESULT_STORE`` names. Both pass the same contract
tests (tests/unit/test_result_store_contract.py).

A JSON result longer than ``TASKPORT_INLINE_RESULT_MAX`` is written as ``result.json`` by
:func:`spill`, and the task record keeps only a reference; :func:`unspill` reads it back.

A store that cannot be reached raises :class:`~app.core.resultbase.StoreUnavailable` (a worker retries
the task, then fails it with error code -5; the API answers 503 with Retry-After). That error, ``FileInfo``
and the checks of ids and names live in :mod:`app.core.resultbase`, which both stores import: this module
imports :mod:`app.core.s3store` (in :func:`result_store`, so boto3 loads only where it is used), never the
other way round.

Each run of a task writes into a folder of its own (``<task_id>/run-<run_id>``, see
:meth:`ResultStore.for_run`): a run whose claim was taken over (a stalled worker that wakes up after
housekeeping re-queued its task) can then neither overwrite nor remove the files of the run that took
over; it removes only its own. The completed run's id is kept beside the result, so the API finds
its file; removing the task's files (expiry, cancel) removes every run's folder.

A writer never leaves a half-written file under its final name: bytes go to a hidden temporary
file in the task's folder that is renamed into place (atomically, ``os.replace``) only when the
``with`` block exits cleanly, and removed when it raises (including a cancellation or a timeout).

A *resumable* writer (:meth:`ResultStore.resumable`, for a file a run may leave half-written for the next
run to finish: ``orders.export``'s CSV) is the same, except that the file is ``.<name>.<id>.partial`` and
survives a graceful stop (the exceptions named in ``keep_on``) and a crash; ``fh.durable()`` syncs it and
names it in a token, and the writer a later run opens with that token takes the file over and continues it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Protocol

import orjson

from app.core.config import Config
from app.core.ids import is_task_id
from app.core.resultbase import FileInfo, ResumableFile, check_name, check_run_id, check_task_id
from app.core.resultbase import StoreUnavailable as StoreUnavailable  # re-exported: importers name it from here

_TEMP_SUFFIX = ".part"
_RUN_PREFIX = "run-"  # a run's folder: run-<run id>
_PARTIAL_SUFFIX = ".partial"  # a resumable writer's file: .<name>.<writer id>.partial
_WRITER_ID = re.compile(r"[0-9a-f]{32}")
SPILLED_NAME = "result.json"  # a JSON result too long for Redis, under the task's folder
SPILLED_REF = "$result_store"  # the reference left in the task record: {SPILLED_REF: name, "size": bytes}


class ResultStore(Protocol):
    run_id: str | None  # the run whose folder this view writes in (for_run), None for the task's whole folder

    """Where result files live. Task ids must be UUIDs and names plain file names (else ValueError)."""

    def writer(self, task_id: str, name: str) -> AbstractContextManager[BinaryIO]:
        """A binary file to write ``name`` into; it appears atomically when the block exits cleanly."""
        ...

    def resumable(self, task_id: str, name: str, token: Any = None, *,
                  keep_on: tuple[type[BaseException], ...] = ()) -> AbstractContextManager[ResumableFile]:
        """Like :meth:`writer`, for a file that may take several runs: ``token`` is what an earlier run's
        ``fh.durable()`` returned (None: start afresh), and one that no longer matches what the store holds
        starts over (``fh.resumed`` is then 0). When the block raises one of ``keep_on`` (a graceful stop)
        the durable bytes stay for the next run, as they do when the process dies; any other exception
        removes them, as :meth:`writer` does. See :class:`~app.core.resultbase.ResumableFile`."""
        ...

    def info(self, task_id: str, name: str, content_type: str) -> FileInfo:
        """Describe a stored file; raises FileNotFoundError when it is not there."""
        ...

    def open(self, task_id: str, name: str) -> BinaryIO:
        """Open a stored file for reading; raises FileNotFoundError when it is not there."""
        ...

    def delete(self, task_id: str) -> None:
        """Remove every file of the task, and any unfinished upload (of a run view: only that run's); idempotent."""
        ...

    def task_ids(self, after: str, limit: int) -> list[str]:
        """Up to ``limit`` ids of tasks that have files (or, in an object store, unfinished uploads), in id
        order, each greater than ``after``. Anything else in the store's place is no task's and not listed."""
        ...

    def has_files(self, task_id: str) -> bool:
        """Whether anything was written for the task (of a run view: by that run)."""
        ...

    def for_run(self, run_id: str | None) -> ResultStore:
        """The same store as one run sees it: files in a folder of the run's own (None: the task's)."""
        ...

    def prune(self, task_id: str) -> None:
        """Of a run view: remove what the task's other runs left. Runs hold a task one after another, so
        those are earlier runs, lost or taken over; a run never removes anything of a later one."""
        ...

    def runs(self, task_id: str) -> list[str]:
        """The ids of the runs of the task that have a folder (:meth:`for_run`), in order."""
        ...


class LocalResultStore:
    """Result files on the local disk: ``<root>/<task_id>/run-<run_id>/<name>`` (a run's view), or
    ``<root>/<task_id>/<name>`` (results written before runs had folders)."""

    def __init__(self, root: Path | str, run_id: str | None = None) -> None:
        self.root = Path(root)
        self.run_id = None if run_id is None else check_run_id(run_id)

    def for_run(self, run_id: str | None) -> LocalResultStore:
        """See :meth:`ResultStore.for_run`."""
        return LocalResultStore(self.root, run_id)

    def _folder(self, task_id: str) -> Path:
        folder = self.root / check_task_id(task_id)
        return folder if self.run_id is None else folder / f"run-{self.run_id}"

    def _path(self, task_id: str, name: str) -> Path:
        return self._folder(task_id) / check_name(name)

    @contextmanager
    def _write(self, task_id: str, name: str) -> Iterator[BinaryIO]:
        final = self._path(task_id, name)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=_TEMP_SUFFIX, dir=final.parent)
        os.close(fd)
        try:
            with open(temp, "wb") as fh:  # by path, so ``fh.name`` tells a processor where it writes
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, final)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def writer(self, task_id: str, name: str) -> AbstractContextManager[BinaryIO]:
        """See :meth:`ResultStore.writer`; ids and names are checked before anything is created."""
        self._path(task_id, name)  # validate eagerly, so a bad name fails at the call, not at `with`
        return self._write(task_id, name)

    def resumable(self, task_id: str, name: str, token: Any = None, *,
                  keep_on: tuple[type[BaseException], ...] = ()) -> AbstractContextManager[ResumableFile]:
        """See :meth:`ResultStore.resumable` and :class:`_Partial`."""
        return _Partial(self._path(task_id, name), token, keep_on)

    def info(self, task_id: str, name: str, content_type: str) -> FileInfo:
        """See :meth:`ResultStore.info`."""
        size = self._path(task_id, name).stat().st_size
        return FileInfo(name=name, size=size, content_type=content_type)

    def open(self, task_id: str, name: str) -> BinaryIO:
        """See :meth:`ResultStore.open`."""
        return self._path(task_id, name).open("rb")

    def has_files(self, task_id: str) -> bool:
        """See :meth:`ResultStore.has_files`."""
        try:
            return any(self._folder(task_id).iterdir())
        except FileNotFoundError:
            return False

    def prune(self, task_id: str) -> None:
        """See :meth:`ResultStore.prune`."""
        if self.run_id is None:
            raise ValueError("prune is for a run's view of the store (for_run)")
        own = self._folder(task_id)
        try:
            others = [p for p in own.parent.iterdir() if p.name.startswith("run-") and p != own]
        except FileNotFoundError:
            return
        for folder in others:
            shutil.rmtree(folder, ignore_errors=True)

    def runs(self, task_id: str) -> list[str]:
        """See :meth:`ResultStore.runs`."""
        try:
            names = os.listdir(self.root / check_task_id(task_id))
        except FileNotFoundError:
            return []
        return sorted(n.removeprefix(_RUN_PREFIX) for n in names if n.startswith(_RUN_PREFIX))

    def delete(self, task_id: str) -> None:
        """See :meth:`ResultStore.delete`. A run's folder that was the last in its task's folder takes that
        folder with it (an empty folder per finished task would pile up)."""
        try:
            shutil.rmtree(self._folder(task_id))
        except FileNotFoundError:
            pass
        if self.run_id is not None:
            with contextlib.suppress(OSError):  # not empty (another run's folder, a file), or gone already
                os.rmdir(self.root / task_id)

    def task_ids(self, after: str, limit: int) -> list[str]:
        """See :meth:`ResultStore.task_ids`."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n > after and is_task_id(n))[:limit]


class _Partial(io.BufferedIOBase):
    """A resumable file on disk (:meth:`ResultStore.resumable`), written as ``.<name>.<id>.partial`` beside
    its final name and renamed into place when the block exits cleanly. ``durable()`` syncs it and puts its
    id and synced size in the token. A writer opened with the token takes the file over: renames it to an id
    of its own (so a run that was taken over and wakes up can no longer remove or finish it) and cuts it to
    the synced size, or, when it is gone or shorter, starts over. Partials of the same name that no token
    names (a crash before the first save) are removed when a writer opens."""

    def __init__(self, final: Path, token: Any, keep_on: tuple[type[BaseException], ...]) -> None:
        super().__init__()
        self._final, self._token, self._keep_on = final, token, keep_on
        self._id = uuid.uuid4().hex
        self._file: BinaryIO | None = None
        self._resumed = 0
        self._started = False  # written to, or positioned by resume_at
        self._folder_synced = False

    def _partial(self, writer_id: str) -> Path:
        return self._final.parent / f".{self._final.name}.{writer_id}{_PARTIAL_SUFFIX}"

    @property
    def name(self) -> str:  # a plain path, as a writer's fh.name is
        return str(self._partial(self._id))

    @property
    def resumed(self) -> int:
        return self._resumed

    def __enter__(self) -> _Partial:
        self._final.parent.mkdir(parents=True, exist_ok=True)
        path = self._partial(self._id)
        self._resumed = self._take_over(path)
        self._remove_strays(path)
        self._file = open(path, "r+b" if self._resumed else "wb")  # closed in __exit__
        self._file.truncate(self._resumed)
        self._file.seek(self._resumed)
        return self

    def _take_over(self, path: Path) -> int:
        """The synced size of the partial the token names, renamed to ``path``; 0 when there is none to take."""
        token = self._token
        if not (isinstance(token, dict) and isinstance(token.get("partial"), str)
                and _WRITER_ID.fullmatch(token["partial"]) and type(token.get("size")) is int and token["size"] > 0):
            return 0
        try:
            os.rename(self._partial(token["partial"]), path)
        except FileNotFoundError:
            return 0
        if path.stat().st_size < token["size"]:  # not the file the token describes: start over
            path.unlink()
            return 0
        return int(token["size"])

    def _remove_strays(self, path: Path) -> None:
        prefix = f".{self._final.name}."
        for entry in os.listdir(self._final.parent):
            if entry.startswith(prefix) and entry.endswith(_PARTIAL_SUFFIX) and entry != path.name:
                (self._final.parent / entry).unlink(missing_ok=True)

    def _open(self) -> BinaryIO:
        if self._file is None:
            raise ValueError("a resumable writer is written inside its with block")
        return self._file

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._started = True
        return self._open().write(data)

    def tell(self) -> int:
        return self._open().tell()

    def resume_at(self, offset: int) -> None:
        """See :meth:`~app.core.resultbase.ResumableFile.resume_at`: on disk the file is cut to ``offset``."""
        if self._started or not 0 <= offset <= self._resumed:
            raise ValueError(f"resume_at({offset}): only before the first write, at most at {self._resumed}")
        self._started = True
        self._open().truncate(offset)
        self._open().seek(offset)

    def durable(self) -> tuple[int, Any]:
        """See :meth:`~app.core.resultbase.ResumableFile.durable` (flush, fsync; the folder's once)."""
        file = self._open()
        file.flush()
        os.fsync(file.fileno())
        if not self._folder_synced:  # the partial's name (created or renamed) must survive a crash too
            folder = os.open(self._final.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
            self._folder_synced = True
        size = file.tell()
        return size, {"partial": self._id, "size": size} if size else None

    def close(self) -> None:
        """Close the file without finishing it (a writer dropped unfinished): the partial stays, as after a crash."""
        if self._file is not None:
            self._file.close()
        super().close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        file, path = self._open(), Path(self.name)
        self._file = None
        try:
            with file:
                if exc is None:
                    file.flush()
                    os.fsync(file.fileno())
            if exc is None:
                os.replace(path, self._final)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        if exc is not None and not isinstance(exc, self._keep_on):
            path.unlink(missing_ok=True)


def remove_runs(store: ResultStore, task_id: str, runs: Iterable[str]) -> None:
    """Remove the folders of the task's runs ``runs`` (each as :meth:`ResultStore.delete` of its run view)."""
    for run in runs:
        store.for_run(run).delete(task_id)


def result_store(config: Config) -> ResultStore:
    """The result store ``TASKPORT_RESULT_STORE`` names (default: files under ``config.results_dir``)."""
    scheme, bucket, where = config.result_location
    if scheme == "s3":
        from app.core.s3store import S3ResultStore  # boto3 loads only where it is used

        return S3ResultStore(bucket, where, scratch=Path(config.data_dir) / "scratch",
                             timeout=config.result_store_timeout, part_size=config.result_part_size)
    return LocalResultStore(where)


def spill(store: ResultStore, task_id: str, result: Any, limit: int) -> Any:
    """``result`` itself when its JSON is at most ``limit`` bytes, else a reference to it, written to
    ``store`` as ``result.json`` (raises StoreUnavailable when the store cannot take it)."""
    body = orjson.dumps(result)
    if len(body) <= limit:
        return result
    with store.writer(task_id, SPILLED_NAME) as fh:
        fh.write(body)
    return {SPILLED_REF: SPILLED_NAME, "size": len(body)}


def unspill(store: ResultStore, task_id: str, stored: dict[str, Any]) -> dict[str, Any]:
    """The stored result with a spilled ``result`` read back from ``store`` (FileNotFoundError when it
    is gone, StoreUnavailable when the store cannot be reached)."""
    ref = stored.get("result")
    if not (isinstance(ref, dict) and set(ref) == {SPILLED_REF, "size"}):
        return stored
    with store.open(task_id, check_name(ref[SPILLED_REF])) as fh:
        return {**stored, "result": orjson.loads(fh.read())}
