"""A real S3-compatible HTTP server on loopback for the tests: moto's standalone server.

It runs in a thread of the test process but answers over TCP like any S3 endpoint, so boto3 in the
test process and in worker/web subprocesses talks to it through its real HTTP stack (signing,
multipart uploads, presigned URLs, connection errors). Buckets are created empty per test.
"""

from __future__ import annotations

import atexit
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from app.core.process import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",  # moto accepts any
               "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environ(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS variables that point boto3 (here or in a child process) at this server."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def new_bucket(self) -> str:
        name = f"tp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def uploads(self, bucket: str) -> list[str]:
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]

    def start_upload(self, bucket: str, key: str) -> None:
        """What a worker killed mid-upload leaves: a multipart upload with one part sent, never completed."""
        client = self.client()
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1024)

    def start(self) -> S3Server:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


@contextmanager
def running_s3() -> Iterator[S3Server]:
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


_held: list[socket.socket] = []


def dead_endpoint() -> str:
    """An endpoint on loopback where nothing listens: every call is refused at once. Its port stays bound
    (never listening) until the run ends, so no other process (another xdist worker's server) takes it."""
    if not _held:
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        atexit.register(held.close)
        _held.append(held)
    return f"http://127.0.0.1:{_held[0].getsockname()[1]}"


def use_s3(monkeypatch: pytest.MonkeyPatch, server: S3Server, endpoint: str | None = None) -> None:
    """Point boto3 in this process (and in children that inherit the environment) at ``server``."""
    for name, value in server.environ(endpoint).items():
        monkeypatch.setenv(name, value)
