"""Result files in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW...): ``s3://bucket/prefix``.

Objects are ``<prefix>/<task_id>/<name>``. The endpoint, region and credentials come from the
standard AWS variables and files, read by boto3 itself (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``...), so the same settings work for
the CLI tools an operator already uses.

A writer streams: bytes collect in one part-sized buffer (``PART_SIZE``); a file that outgrows it
becomes a multipart upload, one part at a time, so no whole file is ever held in memory. The object
appears only when the upload completes (S3 makes a PUT or a CompleteMultipartUpload visible
atomically); a writer that raises aborts its upload, so a failed or cancelled run leaves nothing.
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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from app.core.ids import is_task_id
from app.core.resultbase import FileInfo, StoreUnavailable, check_name, check_run_id, check_task_id

log = logging.getLogger(__name__)
PART_SIZE = 8 * 1024 * 1024  # bytes per multipart part (S3's minimum is 5 MiB): the writer's memory
ATTEMPTS = 3  # botocore's own tries per call (standard retry mode: backoff with jitter)
MAX_RUNS = 1000  # run folders of one task that a prune lists (runs follow one another, a few per task)
_MISSING = {"NoSuchKey", "404", "NotFound"}
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

    def _key(self, task_id: str, name: str) -> str:
        return self._folder(task_id) + check_name(name)

    @contextmanager
    def _write(self, task_id: str, name: str) -> Iterator[BinaryIO]:
        folder = self._scratch(task_id)
        folder.mkdir(parents=True, exist_ok=True)
        upload = _Upload(self, self._key(task_id, name), str(folder / name))
        try:
            yield cast(BinaryIO, upload)
            upload.finish()
        except BaseException:
            upload.abort()
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the task's scratch folder, once no other run uses it
                folder.parent.rmdir()

    def writer(self, task_id: str, name: str) -> AbstractContextManager[BinaryIO]:
        """See :meth:`app.core.results.ResultStore.writer`."""
        self._key(task_id, name)  # validate eagerly
        return self._write(task_id, name)

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


class _Upload(io.BufferedIOBase):
    """A write-only, non-seekable file that uploads to one key: a PUT if it stays within one part,
    else a multipart upload sent a part at a time."""

    def __init__(self, store: S3ResultStore, key: str, name: str) -> None:
        super().__init__()
        self.name = name  # a scratch path beside which a processor may keep temporary files
        self._store, self._key = store, key
        self._buffer = bytearray()
        self._position = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._buffer += view
        self._position += view.nbytes
        size = self._store.part_size
        while len(self._buffer) >= size:
            with memoryview(self._buffer) as whole:
                part = bytes(whole[:size])  # one copy (a bytearray slice would make two)
            del self._buffer[:size]
            self._send_part(part)
        return view.nbytes

    def _send_part(self, body: bytes) -> None:
        s = self._store
        if self._upload_id is None:
            created = translated(lambda: s.client.create_multipart_upload(Bucket=s.bucket, Key=self._key))
            self._upload_id = str(created["UploadId"])
        number = len(self._parts) + 1
        sent = translated(lambda: s.client.upload_part(
            Bucket=s.bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=body))
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    def finish(self) -> None:
        """Make the object visible: one PUT, or the last part and CompleteMultipartUpload."""
        s = self._store
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
            s = self._store
            try:
                translated(lambda: s.client.abort_multipart_upload(
                    Bucket=s.bucket, Key=self._key, UploadId=self._upload_id))
            except (StoreUnavailable, FileNotFoundError) as exc:
                log.warning("could not abort the upload of %s: %s", self._key, exc)
