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
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

from app.core.config import Config
from app.core.ids import is_task_id
from app.core.resultbase import FileInfo, check_name, check_run_id, check_task_id
from app.core.resultbase import StoreUnavailable as StoreUnavailable  # re-exported: importers name it from here

_TEMP_SUFFIX = ".part"
SPILLED_NAME = "result.json"  # a JSON result too long for Redis, under the task's folder
SPILLED_REF = "$result_store"  # the reference left in the task record: {SPILLED_REF: name, "size": bytes}


class ResultStore(Protocol):
    """Where result files live. Task ids must be UUIDs and names plain file names (else ValueError)."""

    def writer(self, task_id: str, name: str) -> AbstractContextManager[BinaryIO]:
        """A binary file to write ``name`` into; it appears atomically when the block exits cleanly."""
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

    def delete(self, task_id: str) -> None:
        """See :meth:`ResultStore.delete`."""
        try:
            shutil.rmtree(self._folder(task_id))
        except FileNotFoundError:
            pass

    def task_ids(self, after: str, limit: int) -> list[str]:
        """See :meth:`ResultStore.task_ids`."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n > after and is_task_id(n))[:limit]


def result_store(config: Config) -> ResultStore:
    """The result store ``TASKPORT_RESULT_STORE`` names (default: files under ``config.results_dir``)."""
    scheme, bucket, where = config.result_location
    if scheme == "s3":
        from app.core.s3store import S3ResultStore  # boto3 loads only where it is used

        return S3ResultStore(bucket, where, scratch=Path(config.data_dir) / "scratch",
                             timeout=config.result_store_timeout)
    return LocalResultStore(where)


def streamed_body(handle: BinaryIO, size: int = 1024 * 1024) -> Blocks | None:
    """A download's body for ``handle``: None for a file on disk (the WSGI server's file wrapper sends it
    with sendfile), else its bytes in ``size`` blocks. An object store's stream read through the file
    wrapper's 8 KiB reads ran at 134 MiB/s and 2.6 web CPU s per GiB; in 1 MiB blocks 377 MiB/s and
    0.4 s (bench/download.py)."""
    try:
        handle.fileno()
        return None
    except (OSError, AttributeError):
        return Blocks(handle, size)


class Blocks:
    """A WSGI body: ``handle``'s bytes ``size`` at a time. The server's ``close()`` closes the handle,
    also when the body was never iterated (a HEAD request) or the client left halfway."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self.handle, self.size = handle, size

    def __iter__(self) -> Iterator[bytes]:
        while block := self.handle.read(self.size):
            yield block

    def close(self) -> None:
        self.handle.close()


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
