"""Result files in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW...): ``s3://bucket/prefix``.

Objects are ``<prefix>/<task_id>/<name>``. The endpoint, region and credentials come from the
standard AWS variables and files, read by boto3 itself (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``...), so the same settings work for
the CLI tools an operator already uses.

A writer streams: bytes collect in one part-sized buffer (``PART_SIZE``); a file that outgrows it
becomes a multipart upload, one part at a time, so no whole file is ever held in memory. The object
appears only when the upload completes (S3 makes a PUT or a CompleteMultipartUpload visible
atomically); a writer that raises aborts its upload, so a failed or cancelled run leaves nothing.
A resumable writer (:meth:`S3ResultStore.resumable`) keeps the multipart upload of a graceful stop or a
crash for the next run: its finished parts are what is durable (the part in the buffer is not), the token
names the upload and the parts' ETags and sizes, and the writer handed the token checks them with
ListParts and goes on with the next part number, or, when the upload or a part is gone, starts over.
Processors that need a scratch file beside their output (openpyxl's write-only sheet) find the
writer's ``name`` in a per-task scratch folder on local disk, removed with the task's files.

Network errors, timeouts and 5xx answers become :class:`StoreUnavailable` (after botocore's own
retries); a missing object becomes FileNotFoundError.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar, cast

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from app.core.ids import is_task_id
from app.core.resultbase import FileInfo, ResumableFile, StoreUnavailable, check_name, check_run_id, check_task_id

log = logging.getLogger(__name__)
PART_SIZE = 8 * 1024 * 1024  # bytes per multipart part (S3's minimum is 5 MiB): the writer's memory
ATTEMPTS = 3  # botocore's own tries per call (standard retry mode: backoff with jitter)
MAX_RUNS = 1000  # run folders of one task that a prune lists (runs follow one another, a few per task)
_MISSING = {"NoSuchKey", "NoSuchUpload", "404", "NotFound"}
_TRANSIENT = {"SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError", "503", "500"}
T = TypeVar("T")


def translated(call: Callable[[], T]) -> T:
    """Run a boto3 call, turning an outage into StoreUnavailable and a missing object into FileNotFoundError."""
    try:
        return call()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if error.get("Code") in _MISSING:
            raise FileNotFoundError("no such result object") from None
        if status >= 500 or error.get("Code") in _TRANSIENT:
            raise StoreUnavailable(f"result store answered {status} {error.get('Code')}") from exc
        raise
    except (BotoConnectionError, HTTPClientError) as exc:
        raise StoreUnavailable(f"result store unreachable: {exc}") from exc


class S3ResultStore:
    """See the module docstring. One client per process (a forked work horse builds its own)."""

    def __init__(self, bucket: str, prefix: str, *, scratch: Path, timeout: float = 5.0,
                 part_size: int = PART_SIZE, attempts: int = ATTEMPTS, run_id: str | None = None) -> None:
        self.run_id = None if run_id is None else check_run_id(run_id)
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.scratch = Path(scratch)
        self.part_size = part_size
        self._boto_config = BotoConfig(connect_timeout=timeout, read_timeout=timeout,
                                       retries={"mode": "standard", "max_attempts": attempts})
        self._client: Any = None
        self._pid = 0

    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():  # never share a connection pool across fork
            self._client = boto3.session.Session().client("s3", config=self._boto_config)
            self._pid = os.getpid()
        return self._client

    def for_run(self, run_id: str | None) -> S3ResultStore:
        """See :meth:`app.core.results.ResultStore.for_run` (shares this store's client)."""
        view = copy.copy(self)
        view.run_id = None if run_id is None else check_run_id(run_id)
        return view

    def _task_folder(self, task_id: str) -> str:
        return f"{self.prefix}{check_task_id(task_id)}/"

    def _folder(self, task_id: str) -> str:
        task = self._task_folder(task_id)
        return task if self.run_id is None else f"{task}run-{self.run_id}/"

    def _scratch(self, task_id: str) -> Path:
        return self.scratch / check_task_id(task_id) / (f"run-{self.run_id}" if self.run_id else "task")

    def has_files(self, task_id: str) -> bool:
        """See :meth:`app.core.results.ResultStore.has_files` (one LIST call)."""
        folder = self._folder(task_id)
        page = translated(lambda: self.client.list_objects_v2(Bucket=self.bucket, Prefix=folder, MaxKeys=1))
        return bool(page.get("Contents"))

    def prune(self, task_id: str) -> None:
        """See :meth:`app.core.results.ResultStore.prune`: the folders of the task's other runs."""
        if self.run_id is None:
            raise ValueError("prune is for a run's view of the store (for_run)")
        task, own = self._task_folder(task_id), self._folder(task_id)
        runs = translated(lambda: self._folders(task, "", MAX_RUNS, lambda name: name.startswith("run-")))
        for folder in (f"{task}{name}/" for name in runs):
            if folder != own:
                translated(functools.partial(self._delete, folder))

    def runs(self, task_id: str) -> list[str]:
        """See :meth:`app.core.results.ResultStore.runs` (objects or unfinished uploads under ``run-<id>/``)."""
        task = self._task_folder(task_id)
        found = translated(lambda: self._folders(task, "", MAX_RUNS, lambda name: name.startswith("run-")))
        return [name.removeprefix("run-") for name in found]

    def _key(self, task_id: str, name: str) -> str:
        return self._folder(task_id) + check_name(name)

    def writer(self, task_id: str, name: str) -> AbstractContextManager[BinaryIO]:
        """See :meth:`app.core.results.ResultStore.writer`."""
        return cast(AbstractContextManager[BinaryIO], _Writing(self, task_id, name))

    def resumable(self, task_id: str, name: str, token: Any = None, *,
                  keep_on: tuple[type[BaseException], ...] = ()) -> AbstractContextManager[ResumableFile]:
        """See :meth:`app.core.results.ResultStore.resumable` and the module docstring."""
        return _Writing(self, task_id, name, resume=True, token=token, keep_on=keep_on)

    def info(self, task_id: str, name: str, content_type: str) -> FileInfo:
        """See :meth:`app.core.results.ResultStore.info`."""
        key = self._key(task_id, name)
        head = translated(lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        return FileInfo(name=name, size=int(head["ContentLength"]), content_type=content_type)

    def open(self, task_id: str, name: str) -> BinaryIO:
        """See :meth:`app.core.results.ResultStore.open`: the object's body, streamed as it is read."""
        key = self._key(task_id, name)
        return cast(BinaryIO, translated(lambda: self.client.get_object(Bucket=self.bucket, Key=key))["Body"])

    def presign(self, task_id: str, name: str, expires_s: int) -> str:
        """A URL that fetches the object without credentials for ``expires_s`` seconds."""
        params = {"Bucket": self.bucket, "Key": self._key(task_id, name)}
        return str(self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s))

    def delete(self, task_id: str) -> None:
        """See :meth:`app.core.results.ResultStore.delete`. With the store unreachable this logs and returns:
        housekeeping's orphan sweep removes what is left once the task has no result to serve."""
        folder = self._folder(task_id)
        shutil.rmtree(self._scratch(task_id) if self.run_id else self.scratch / task_id, ignore_errors=True)
        try:
            translated(lambda: self._delete(folder))
        except StoreUnavailable as exc:
            log.warning("could not delete the result objects of %s (the orphan sweep will): %s", task_id, exc)

    def _delete(self, folder: str) -> None:
        c = self.client
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objects:
                c.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        for page in c.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=folder):
            for upload in page.get("Uploads", []):
                c.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    def task_ids(self, after: str, limit: int) -> list[str]:
        """See :meth:`app.core.results.ResultStore.task_ids`: task folders holding objects or unfinished
        multipart uploads (a folder a killed worker left with nothing but its upload lists no object)."""
        return translated(lambda: self._folders(self.prefix, after, limit, is_task_id))

    def _folders(self, parent: str, after: str, limit: int, wanted: Callable[[str], bool]) -> list[str]:
        """The first ``limit`` names, in order, of the ``wanted`` folders directly under ``parent`` that sort
        after ``after`` and hold objects, unfinished multipart uploads or both: the union of the first
        ``limit`` of each listing holds the first ``limit`` of both."""
        start = f"{parent}{after}/~" if after else ""  # "~" sorts after every character a name may hold
        found: set[str] = set()
        for operation, marker in (("list_objects_v2", "StartAfter"), ("list_multipart_uploads", "KeyMarker")):
            found |= self._listed(operation, {marker: start} if start else {}, parent,
                                  lambda name: name > after and wanted(name), limit)
        return sorted(found)[:limit]

    def _listed(self, operation: str, start: dict[str, str], parent: str, keep: Callable[[str], bool],
                limit: int) -> set[str]:
        """At least the first ``limit`` kept folder names of one listing (with a delimiter: a page of
        CommonPrefixes; a server that ignores it, as moto's does for uploads, names each upload's key)."""
        names: set[str] = set()
        pages = self.client.get_paginator(operation).paginate(
            Bucket=self.bucket, Prefix=parent, Delimiter="/", PaginationConfig={"PageSize": min(limit, 1000)},
            **start)
        for page in pages:
            keys = [p["Prefix"] for p in page.get("CommonPrefixes", [])] + [u["Key"] for u in page.get("Uploads", [])]
            names.update(name for name in map(functools.partial(_folder_name, parent), keys) if name and keep(name))
            if len(names) >= limit:
                break
        return names


def _folder_name(parent: str, key: str) -> str:
    """The name of the folder directly under ``parent`` that ``key`` lies in ("" for a key beside it)."""
    name, slash, _ = key[len(parent):].partition("/")
    return name if slash else ""


class _Writing(AbstractContextManager["_Upload"]):
    """One writer's life: its scratch folder, its upload (of a resumable writer: continued from ``token`` when
    it can be), and its end: complete on a clean exit, else abort, unless the exception is one of ``keep_on``.
    The ids and the name are checked at the call, before anything is created."""

    def __init__(self, store: S3ResultStore, task_id: str, name: str, *, resume: bool = False, token: Any = None,
                 keep_on: tuple[type[BaseException], ...] = ()) -> None:
        self._store, self._key, self._name = store, store._key(task_id, name), name
        self._folder = store._scratch(task_id)
        self._resume, self._token, self._keep_on = resume, token, keep_on
        self._upload: _Upload | None = None

    def __enter__(self) -> _Upload:
        self._folder.mkdir(parents=True, exist_ok=True)
        upload = self._upload = _Upload(self._store, self._key, str(self._folder / self._name))
        if self._resume:
            try:
                upload.resume(self._token)
            except BaseException:
                self._clean()
                raise
        return upload

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        upload = self._upload
        assert upload is not None
        try:
            if exc is None:
                upload.finish()
            elif not isinstance(exc, self._keep_on):
                upload.abort()
        except BaseException:
            upload.abort()
            raise
        finally:
            self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the task's scratch folder, once no other run uses it
            self._folder.parent.rmdir()


class _Upload(io.BufferedIOBase):
    """A write-only, non-seekable file that uploads to one key: a PUT if it stays within one part,
    else a multipart upload sent a part at a time. Of a resumable writer, also a
    :class:`~app.core.resultbase.ResumableFile`: see :meth:`resume`, :meth:`durable`, :meth:`resume_at`."""

    def __init__(self, store: S3ResultStore, key: str, name: str) -> None:
        super().__init__()
        self.name = name  # a scratch path beside which a processor may keep temporary files
        self._store, self._key = store, key
        self._buffer = bytearray()
        self._position = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._sizes: list[int] = []  # of the finished parts: what is durable
        self.resumed = 0
        self._skip = 0  # bytes written again after resume_at that the finished parts already hold
        self._started = False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = view.nbytes
        self._started = True
        if self._skip:
            skipped = min(self._skip, written)
            self._skip -= skipped
            self._position += skipped
            view = view[skipped:]
        self._buffer += view
        self._position += view.nbytes
        size = self._store.part_size
        while len(self._buffer) >= size:
            with memoryview(self._buffer) as whole:
                part = bytes(whole[:size])  # one copy (a bytearray slice would make two)
            del self._buffer[:size]
            self._send_part(part)
        return written

    def _send_part(self, body: bytes) -> None:
        s = self._store
        if self._upload_id is None:
            created = translated(lambda: s.client.create_multipart_upload(Bucket=s.bucket, Key=self._key))
            self._upload_id = str(created["UploadId"])
        number = len(self._parts) + 1
        sent = translated(lambda: s.client.upload_part(
            Bucket=s.bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=body))
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        self._sizes.append(len(body))

    def durable(self) -> tuple[int, Any]:
        """See :meth:`~app.core.resultbase.ResumableFile.durable`: the finished parts (no call to S3)."""
        if not self._parts:
            return 0, None
        parts = [[part["ETag"], size] for part, size in zip(self._parts, self._sizes, strict=True)]
        return sum(self._sizes), {"upload": self._upload_id, "parts": parts}

    def resume(self, token: Any) -> None:
        """Continue the upload ``token`` names if ListParts shows each of its parts as the token has it,
        else start over; either way abort the other unfinished uploads of this key (an earlier run's
        crash before its first save, or the upload of a token that no longer matches)."""
        wanted = _token_parts(token)
        if wanted is not None and self._listed(*wanted):
            self._upload_id = wanted[0]
            self._parts = [{"PartNumber": n, "ETag": etag} for n, (etag, _) in enumerate(wanted[1], 1)]
            self._sizes = [size for _, size in wanted[1]]
            self.resumed = self._position = sum(self._sizes)
        s = self._store
        pages = s.client.get_paginator("list_multipart_uploads").paginate(Bucket=s.bucket, Prefix=self._key)
        for upload in (u for page in translated(lambda: list(pages)) for u in page.get("Uploads", [])):
            if upload["Key"] == self._key and upload["UploadId"] != self._upload_id:
                self._abort(upload["UploadId"])

    def _listed(self, upload_id: str, parts: list[tuple[str, int]]) -> bool:
        s = self._store
        pages = s.client.get_paginator("list_parts").paginate(Bucket=s.bucket, Key=self._key, UploadId=upload_id)
        try:
            listed = {p["PartNumber"]: (p["ETag"], p["Size"])
                      for page in translated(lambda: list(pages)) for p in page.get("Parts", [])}
        except FileNotFoundError:  # the upload is gone: aborted, completed, or expired by a lifecycle rule
            return False
        return all(listed.get(n) == (etag, size) for n, (etag, size) in enumerate(parts, 1))

    def resume_at(self, offset: int) -> None:
        """See :meth:`~app.core.resultbase.ResumableFile.resume_at`: the bytes up to ``resumed`` are skipped."""
        if self._started or not 0 <= offset <= self.resumed:
            raise ValueError(f"resume_at({offset}): only before the first write, at most at {self.resumed}")
        self._started = True
        self._skip, self._position = self.resumed - offset, offset

    def finish(self) -> None:
        """Make the object visible: one PUT, or the last part and CompleteMultipartUpload."""
        s = self._store
        if self._skip:
            raise ValueError(f"resumed after {self.resumed} bytes but only {self._position} were written again")
        if self._upload_id is None:
            body = bytes(self._buffer)
            translated(lambda: s.client.put_object(Bucket=s.bucket, Key=self._key, Body=body))
        else:
            if self._buffer:
                self._send_part(bytes(self._buffer))
            translated(lambda: s.client.complete_multipart_upload(
                Bucket=s.bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}))
        self._buffer = bytearray()

    def abort(self) -> None:
        """Drop a started multipart upload (best effort: the orphan sweep or a lifecycle rule is the backstop)."""
        self._buffer = bytearray()
        if self._upload_id is not None:
            self._abort(self._upload_id)

    def _abort(self, upload_id: str) -> None:
        s = self._store
        try:
            translated(lambda: s.client.abort_multipart_upload(Bucket=s.bucket, Key=self._key, UploadId=upload_id))
        except (StoreUnavailable, FileNotFoundError) as exc:
            log.warning("could not abort the upload of %s: %s", self._key, exc)


def _token_parts(token: Any) -> tuple[str, list[tuple[str, int]]] | None:
    """``(upload id, [(etag, size), ...])`` from a resumable writer's token, or None when it is not one."""
    if not isinstance(token, dict) or not isinstance(token.get("upload"), str) or not token["upload"]:
        return None
    parts = token.get("parts")
    if not (isinstance(parts, list) and parts and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int and p[1] > 0
            for p in parts)):
        return None
    return token["upload"], [(etag, size) for etag, size in parts]
