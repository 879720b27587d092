"""Live output (issue 30): 1,000 lines a second from one task reaching an SSE watcher, and Redis bytes per line.

A worker runs ``bench.emit`` (registered here; the web and the worker load this module through
TASKPORT_PROCESSORS), which emits ``rate`` lines a second for ``seconds``, each at its due time (not in bursts),
through ``ctx.emit``. One watcher follows the task's event stream from before the first line; each ``output``
event's delay is the time it arrived minus its ``at`` (when the processor emitted it: the same machine's clock,
ms). Then the task's output list: ``MEMORY USAGE`` (every element counted) over its length.

    python bench/run.py --only output
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import orjson
import requests
from marshmallow import Schema, fields, validate

from app.core import keys
from app.core.processors import processor
from bench.loadgen import percentile
from bench.report import Row, _check
from bench.stack import Stack
from workers.context import TaskContext

RATE, SECONDS, WIDTH = 1000, 10.0, 40  # lines a second, for how long, bytes of text per line
TARGET_P99_S = 1.0
LEAD = 1.0  # seconds before the first line: the watcher's stream is open by then


class EmitSchema(Schema):
    rate = fields.Integer(load_default=RATE, validate=validate.Range(1, 100_000))
    seconds = fields.Float(load_default=SECONDS, validate=validate.Range(0, 600))
    width = fields.Integer(load_default=WIDTH, validate=validate.Range(8, 4096))
    lead = fields.Float(load_default=LEAD, validate=validate.Range(0, 10))  # the watcher connects meanwhile


@processor("bench.emit", schema=EmitSchema, timeout=700)
def emit(payload: dict, ctx: TaskContext) -> dict:
    """``rate`` lines a second for ``seconds``, each at its due time: ``line <n> `` padded to ``width`` bytes."""
    rate, count, width = payload["rate"], int(payload["rate"] * payload["seconds"]), payload["width"]
    ctx.sleep(payload["lead"])
    started = time.monotonic()
    for n in range(count):
        wait = started + n / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        ctx.emit(f"line {n} ".ljust(width, "x"))
    return {"lines": count}


def _iso_ms(iso: str) -> float:
    """Seconds since the epoch of an API timestamp (``2026-12-07T07:40:00.120Z``)."""
    import calendar

    return calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S")) + int(iso[20:23]) / 1000


def watch(base_url: str, task_id: str, delays: list[float], ready: threading.Event, done: threading.Event) -> None:
    """Follow the task's stream until its final status: the delay of each output line into ``delays``."""
    with requests.get(f"{base_url}/api/v1/tasks/{task_id}/events", stream=True, timeout=60) as answer:
        ready.set()
        buffer = b""
        for data in answer.iter_content(chunk_size=None):
            arrived = time.time()
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                fields_ = dict(line.split(b": ", 1) for line in event.split(b"\n") if not line.startswith(b":"))
                if fields_.get(b"event") == b"output":
                    delays.append(arrived - _iso_ms(orjson.loads(fields_[b"data"])["at"]))
                elif fields_.get(b"event") == b"status" and orjson.loads(fields_[b"data"])["status"] in (
                        "COMPLETED", "FAILED", "CANCELLED"):
                    done.set()
                    return


def measure(stack: Stack, rate: int = RATE, seconds: float = SECONDS, width: int = WIDTH) -> dict[str, Any]:
    config = replace(stack.config, processors="bench.output_live")
    stack.start_web(config)
    workers = stack.start_workers("simple", 1, config=config)
    try:
        submitted = requests.post(f"{stack.base_url}/api/v1/tasks", timeout=10, json={
            "type": "bench.emit", "payload": {"rate": rate, "seconds": seconds, "width": width}})
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["task_id"]
        delays: list[float] = []
        ready, done = threading.Event(), threading.Event()
        watcher = threading.Thread(target=watch, args=(stack.base_url, task_id, delays, ready, done), daemon=True)
        watcher.start()
        assert ready.wait(LEAD), "the stream did not open before the first line"
        watcher.join(timeout=seconds + 60)
        assert done.is_set(), "the stream did not end with the task"
        conn = stack.client()
        try:
            lines = int(conn.llen(keys.output(task_id)))
            used = int(conn.memory_usage(keys.output(task_id), samples=0) or 0)
            counted = int(conn.hget(keys.task(task_id), keys.TaskField.OUTPUT_BYTES) or 0)
        finally:
            conn.close()
    finally:
        stack.stop(*workers)
    ordered = sorted(delays)
    return {"rate": rate, "seconds": seconds, "width": width, "lines": len(delays), "expected": int(rate * seconds),
            "p50_s": percentile(ordered, 50), "p99_s": percentile(ordered, 99), "max_s": ordered[-1] if ordered else 0,
            "kept": lines, "memory_usage": used, "bytes_per_line": used / lines if lines else 0,
            "quota_bytes_per_line": counted / lines if lines else 0}


def rows(out: dict[str, Any]) -> list[Row]:
    ms = {k: out[k] * 1000 for k in ("p50_s", "p99_s", "max_s")}
    return [
        Row(f"live output: {out['rate']:,} lines/s from one task for {out['seconds']:g} s to an SSE watcher "
            f"({out['lines']:,} of {out['expected']:,} lines), delay p50 / p99 / max",
            f"{ms['p50_s']:,.0f} / {ms['p99_s']:,.0f} / {ms['max_s']:,.0f} ms", target="p99 ≤ 1 s",
            verdict=_check(out["p99_s"] <= TARGET_P99_S and out["lines"] == out["expected"])),
        Row(f"live output: Redis bytes per line ({out['width']} bytes of text; MEMORY USAGE of the list of "
            f"{out['kept']:,} lines / lines)", f"{out['bytes_per_line']:,.1f} B",
            baseline=f"{out['quota_bytes_per_line']:,.1f} B counted in the quota"),
    ]
