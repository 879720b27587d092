"""A closed-loop HTTP/1.1 load generator: asyncio protocols over raw keep-alive sockets, in its own process.

    python -m bench.loadgen --port 8000 --kind hello --conns 16 --warmup 2 --duration 5

Each of ``--conns`` connections sends one request, waits for the whole response (status line, headers,
``Content-Length`` body), records the latency and sends the next, so the offered load follows the
server. Requests are pre-built bytes (a unique body per submit is one ``%`` format); a response is
parsed only as far as the status code and the length. Nothing is recorded during the warm-up; the
window then runs for ``--duration`` seconds. The answer is one JSON line on stdout, including the CPU
this process used, so the report can show that the generator was not the bottleneck.

Why not requests/aiohttp/httpx: their per-request Python overhead is several times ours, and on a
2-core machine every cycle the generator burns is taken from the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path

KINDS = ("hello", "get", "submit", "status", "canned", "batch-submit", "batch-status", "flower-submit",
         "flower-status", "flower-info")
PATHS = {"hello": "/bench/hello", "get": "/bench/get", "canned": "/"}
SUBMIT_BODY = '{"type":"demo.sleep","payload":{"seconds":0,"steps":1,"fail_items":[%d]}}'
EXPECTED = {"hello": 200, "get": 200, "canned": 200, "submit": 202, "status": 200, "batch-submit": 202,
            "batch-status": 200, "flower-submit": 200, "flower-status": 200, "flower-info": 200}
# the Celery peer, through Flower's REST API: apply the no-op task (bench.celery_app), read a task's result
# (from the result backend) or its info (Flower's in-memory state, fed by the worker's events)
FLOWER_SUBMIT = ("/api/task/async-apply/bench.celery_app.noop", '{"args":[%d]}')
READ_PATHS = {"status": "/api/v1/tasks/%s", "batch-status": "/api/v1/batches/%s",
              "flower-status": "/api/task/result/%s", "flower-info": "/api/task/info/%s"}


def batch_body(first: int, size: int) -> bytes:
    """A ``POST /api/v1/batches`` body of ``size`` submit bodies, numbered from ``first`` (unique payloads)."""
    return b'{"tasks":[' + ",".join(SUBMIT_BODY % n for n in range(first, first + size)).encode() + b"]}"


def request_factory(kind: str, host: str, ids: list[str], base: int, size: int = 1,
                    bearers: list[str] | None = None) -> Callable[[int], bytes]:
    """A function n -> the bytes of the n-th request of this kind (``size``: tasks per batch-submit; ``bearers``:
    the ``Authorization: Bearer`` of a read, one for all or one per id, in the ids' order)."""
    head = f"Host: {host}\r\nUser-Agent: taskport-bench\r\n"
    if kind == "submit":
        def submit(n: int) -> bytes:
            # fail_items only matters when items > 0: the payload is unique (dedup never hits), the task a no-op
            body = (SUBMIT_BODY % (base + n)).encode()
            return (f"POST /api/v1/tasks HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        return submit
    if kind == "flower-submit":
        def flower_submit(n: int) -> bytes:
            body = (FLOWER_SUBMIT[1] % (base + n)).encode()
            return (f"POST {FLOWER_SUBMIT[0]} HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        return flower_submit
    if kind == "batch-submit":
        def batch_submit(n: int) -> bytes:
            body = batch_body(base + n * size, size)
            return (f"POST /api/v1/batches HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        return batch_submit
    if kind in READ_PATHS:
        if not ids:
            raise SystemExit(f"--kind {kind} needs --ids FILE with task (or batch) ids")
        path = READ_PATHS[kind]
        auth = [f"Authorization: Bearer {b}\r\n" for b in bearers] if bearers else [""]
        prebuilt = [f"GET {path % i} HTTP/1.1\r\n{head}{auth[n % len(auth)]}\r\n".encode() for n, i in enumerate(ids)]
        return lambda n: prebuilt[n % len(prebuilt)]
    fixed = f"GET {PATHS[kind]} HTTP/1.1\r\n{head}\r\n".encode()
    return lambda n: fixed


class Run:
    """Shared state of one measurement: the request source, the clock window and what was recorded."""

    def __init__(self, make: Callable[[int], bytes], start: float, end: float) -> None:
        self.make = make
        self.start = start  # recording starts (end of warm-up)
        self.end = end
        self.sent = 0
        self.latencies = array("d")
        self.statuses: Counter[int] = Counter()
        self.reconnects = 0
        self.done = asyncio.get_running_loop().create_future()
        self.open = 0

    def next_request(self) -> bytes:
        n = self.sent
        self.sent += 1
        return self.make(n)

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0 and time.perf_counter() >= self.end and not self.done.done():
            self.done.set_result(None)


class Client(asyncio.Protocol):
    """One keep-alive connection: request, full response, next request."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.buf = bytearray()
        self.need = -1  # bytes of the current response (headers + body), -1 until the headers are in
        self.status = 0
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.run.open += 1
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        if time.perf_counter() >= self.run.end:
            self.transport.close()
            return
        self.sent_at = time.perf_counter()
        self.transport.write(self.run.next_request())

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0 and not self._parse_head():
                return
            if len(self.buf) < self.need:
                return
            del self.buf[: self.need]
            self.need = -1
            self._record()
            self._send()
            if not self.buf:
                return

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buf[:end]).lower()
        self.status = int(head[9:12])
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError("response without Content-Length: " + head[:200].decode(errors="replace"))
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17: stop if stop > 0 else len(head)])
        self.need = end + 4 + length
        return True

    def _record(self) -> None:
        now = time.perf_counter()
        if self.run.start <= now <= self.run.end:  # completions inside the window only (a batch takes long)
            self.run.latencies.append(now - self.sent_at)
            self.run.statuses[self.status] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.closed()
        if time.perf_counter() < self.run.end:
            self.run.reconnects += 1  # the server closed a keep-alive connection: open another
            loop = asyncio.get_running_loop()
            loop.create_task(loop.create_connection(lambda: Client(self.run), *self._peer()))

    def _peer(self) -> tuple[str, int]:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("peername")[:2]
        return host, port


async def drive(host: str, port: int, kind: str, conns: int, warmup: float, duration: float, ids: list[str],
                base: int, size: int = 1, bearers: list[str] | None = None) -> dict[str, object]:
    t0 = time.perf_counter()
    run = Run(request_factory(kind, f"{host}:{port}", ids, base, size, bearers), t0 + warmup,
              t0 + warmup + duration)
    loop = asyncio.get_running_loop()
    for _ in range(conns):
        await loop.create_connection(lambda: Client(run), host, port)
    cpu0 = cpu_seconds()
    await asyncio.sleep(max(0.0, run.start - time.perf_counter()))
    cpu_window0 = cpu_seconds()
    await asyncio.wait_for(run.done, timeout=warmup + duration + 30)
    measured = min(time.perf_counter(), run.end) - run.start
    cpu_window = cpu_seconds() - cpu_window0
    found = summarize(run, kind, measured, cpu_window, cpu_seconds() - cpu0)
    found["conns"] = conns
    if kind == "batch-submit":  # a request is a batch: what counts is the tasks it carried
        found["batch_size"] = size
        found["tasks_per_s"] = round(float(found["rps"]) * size, 1)  # type: ignore[arg-type]
    return found


def summarize(run: Run, kind: str, seconds: float, cpu_window: float, cpu_total: float) -> dict[str, object]:
    lat = sorted(run.latencies)
    n = len(lat)
    expected = EXPECTED[kind]
    errors = {str(code): count for code, count in run.statuses.items() if code != expected}
    return {
        "kind": kind, "requests": n, "seconds": round(seconds, 3), "rps": round(n / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentile(lat, 50) * 1000, 3), "p99_ms": round(percentile(lat, 99) * 1000, 3),
        "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0, "errors": errors, "reconnects": run.reconnects,
        "submitted_total": run.sent, "loadgen_cpu_share": round(cpu_window / seconds, 3) if seconds else 0.0,
        "loadgen_cpu_s": round(cpu_total, 3),
    }


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def cpu_seconds() -> float:
    """CPU (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--ids", type=Path, help="file with one id a line (task ids, or batch ids for batch-status)")
    parser.add_argument("--base", type=int, default=0, help="first number in the unique submit payloads")
    parser.add_argument("--size", type=int, default=1000, help="tasks per request of --kind batch-submit")
    parser.add_argument("--bearers", type=Path, help="file with the reads' Authorization: Bearer values: one for "
                                                     "every id, or one a line in the order of --ids")
    args = parser.parse_args(argv)
    ids = args.ids.read_text().split() if args.ids else []
    bearers = args.bearers.read_text().split() if args.bearers else None
    result = asyncio.run(drive(args.host, args.port, args.kind, args.conns, args.warmup, args.duration, ids,
                               args.base, args.size, bearers))
    result["pid"] = os.getpid()
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
