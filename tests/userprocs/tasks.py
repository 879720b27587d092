"""Processors registered from outside the service, for the registry and integration tests.

- ``user.echo``: the smallest user processor, ``{"text": "hi"}`` -> ``{"echo": "hi"}``.
- ``test.flaky``: fails with an unexpected exception on its first ``fail_times`` calls, then
  succeeds; calls are counted in the ``marker`` file (one line per call) so the count survives
  across worker processes. Retries twice, so ``fail_times`` 2 completes and 3 fails with -1.
- ``test.slow``: sleeps ``seconds`` without any checkpoint (plain ``time.sleep``) under a 1 s job
  timeout, to exercise RQ's hard timeout (-2).
- ``test.nap``: sleeps cooperatively with progress and one retry: what a killed worker leaves behind.
- ``test.stuck``: sleeps ``seconds`` in one call, no checkpoint, under a long timeout: what only the
  end of its process can stop after a cancel.
- ``test.crash``: ends its own process (``os._exit`` or a segfault) on the first call (counted in
  ``marker``, like ``test.flaky``), returns on the next: a processor that kills its own process.
"""

from __future__ import annotations

import ctypes
import os
import time

from marshmallow import Schema, fields, validate

from workers.context import TaskContext
from workers.processors import processor


class EchoSchema(Schema):
    text = fields.String(required=True, validate=validate.Length(max=1000))


@processor("user.echo", schema=EchoSchema, timeout=30)
def echo(payload: dict, ctx: TaskContext) -> dict:
    """Return the text it was given."""
    return {"echo": payload["text"]}


class FlakySchema(Schema):
    marker = fields.String(required=True, validate=validate.Length(min=1))
    fail_times = fields.Integer(required=True, strict=True, validate=validate.Range(0, 100))


@processor("test.flaky", schema=FlakySchema, timeout=30, retries=2)
def flaky(payload: dict, ctx: TaskContext) -> dict:
    """Raise RuntimeError on the first ``fail_times`` calls (counted in the marker file)."""
    fd = os.open(payload["marker"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"call\n")  # one O_APPEND write per call: safe across processes
    finally:
        os.close(fd)
    with open(payload["marker"], "rb") as fh:
        calls = fh.read().count(b"\n")
    if calls <= payload["fail_times"]:
        raise RuntimeError(f"flaky failure on call {calls}")
    return {"calls": calls}


class SlowSchema(Schema):
    seconds = fields.Float(required=True, validate=validate.Range(0, 60))


@processor("test.slow", schema=SlowSchema, timeout=1)
def slow(payload: dict, ctx: TaskContext) -> dict:
    """Sleep without checkpoints, so only the job timeout can stop it."""
    time.sleep(payload["seconds"])
    return {"slept": payload["seconds"]}


class NapSchema(Schema):
    seconds = fields.Float(required=True, validate=validate.Range(0, 600))


@processor("test.nap", schema=NapSchema, timeout=600, retries=1)
def nap(payload: dict, ctx: TaskContext) -> dict:
    """Sleep cooperatively with progress, retried once: the task a killed worker leaves behind."""
    steps = max(1, int(payload["seconds"] * 10))
    for step in range(steps):
        ctx.sleep(payload["seconds"] / steps)
        ctx.progress(step + 1, steps)
    return {"slept": payload["seconds"], "pid": os.getpid()}


@processor("test.stuck", schema=SlowSchema, timeout=600)
def stuck(payload: dict, ctx: TaskContext) -> dict:
    """Sleep without checkpoints under a long timeout: a cancel reaches it only by ending its process."""
    time.sleep(payload["seconds"])
    return {"slept": payload["seconds"]}


class CrashSchema(Schema):
    marker = fields.String(required=True, validate=validate.Length(min=1))
    how = fields.String(required=True, validate=validate.OneOf(["exit", "segfault"]))


@processor("test.crash", schema=CrashSchema, timeout=30, retries=2)
def crash(payload: dict, ctx: TaskContext) -> dict:
    """End this process on the first call (``os._exit`` or a segfault), return on the later ones."""
    fd = os.open(payload["marker"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"call\n")
    finally:
        os.close(fd)
    with open(payload["marker"], "rb") as fh:
        calls = fh.read().count(b"\n")
    if calls == 1:
        if payload["how"] == "exit":
            os._exit(3)
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return {"calls": calls}
