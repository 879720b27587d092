"""Many live SSE watchers in one process: asyncio protocols over raw sockets, like ``bench.loadgen``.

    python -m bench.watchers --port 8000 --ids FILE --count 1000

Opens ``--count`` ``GET /api/v1/tasks/{id}/events`` streams, spread round-robin over the task ids
in ``--ids``, decodes the chunked framing and the events, and prints ``ready <opened> <refused>``
once every stream has answered (its first event, the snapshot, or a refusal). From then on every
event's delay is recorded: the time it arrived minus the ``updated_at`` of the document it
carries (the writer's clock: the same machine), and every id the stream jumped over (changes the
server coalesced into a later event, which the contract allows). A line ``stop`` on stdin ends the run; the answer
is one JSON line on stdout (delays, events per task, refusals, the CPU this process used).
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import functools
import json
import sys
import time
from array import array
from collections import Counter
from pathlib import Path

import orjson

from bench.loadgen import cpu_seconds, percentile


@functools.lru_cache(maxsize=64)
def _second(iso_second: str) -> int:
    return calendar.timegm(time.strptime(iso_second, "%Y-%m-%dT%H:%M:%S"))


def _epoch(iso: str) -> float:
    """Seconds since the epoch of an API timestamp (``2026-11-29T10:00:00.120Z``); strptime once per
    second of timestamps, not per event (the watcher process shares the machine with what it measures)."""
    return _second(iso[:19]) + int(iso[20:23]) / 1000


class Tally:
    def __init__(self, count: int) -> None:
        self.count = count
        self.answered = 0
        self.refused: Counter[int] = Counter()
        self.delays = array("d")
        self.events: Counter[str] = Counter()  # task id -> change events received (snapshots excluded)
        self.ended = 0
        self.skipped = 0  # event ids jumped over (coalesced changes), over every stream
        self.all_answered = asyncio.get_running_loop().create_future()

    def answer(self) -> None:
        self.answered += 1
        if self.answered == self.count and not self.all_answered.done():
            self.all_answered.set_result(None)


class Watcher(asyncio.Protocol):
    """One event stream: head, then chunked body split into events."""

    def __init__(self, tally: Tally, task_id: str, request: bytes) -> None:
        self.tally = tally
        self.task_id = task_id
        self.request = request
        self.raw = bytearray()
        self.body = bytearray()
        self.head_done = False
        self.snapshot_seen = False
        self.last_seq = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.raw += data
        if not self.head_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            status = int(self.raw[9:12])
            del self.raw[:end + 4]
            self.head_done = True
            if status != 200:
                self.tally.refused[status] += 1
                self.tally.answer()
                return
        self._dechunk()
        self._events()

    def _dechunk(self) -> None:
        while True:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if len(self.raw) < line_end + 2 + size + 2:
                return
            self.body += self.raw[line_end + 2:line_end + 2 + size]
            del self.raw[:line_end + 2 + size + 2]

    def _events(self) -> None:
        now = time.time()
        while (at := self.body.find(b"\n\n")) >= 0:
            chunk = bytes(self.body[:at])
            del self.body[:at + 2]
            lines = chunk.split(b"\n")
            data = next((line[6:] for line in lines if line.startswith(b"data: ")), None)
            if data is None:
                continue  # a comment
            seq = int(next(line[4:] for line in lines if line.startswith(b"id: ")))
            if not self.snapshot_seen:
                self.snapshot_seen = True
                self.last_seq = seq
                self.tally.answer()
                continue
            # ids skipped: changes the server coalesced into a later event (allowed: it sends the latest state)
            self.tally.skipped += max(seq - self.last_seq - 1, 0)
            self.last_seq = seq
            self.tally.delays.append(now - _epoch(orjson.loads(data)["updated_at"]))
            self.tally.events[self.task_id] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.tally.ended += 1


async def watch(host: str, port: int, ids: list[str], count: int) -> dict[str, object]:
    tally = Tally(count)
    loop = asyncio.get_running_loop()
    head = f"Host: {host}:{port}\r\nUser-Agent: taskport-bench-watcher\r\nAccept: text/event-stream\r\n\r\n"
    transports = []
    for n in range(count):
        task_id = ids[n % len(ids)]
        request = f"GET /api/v1/tasks/{task_id}/events HTTP/1.1\r\n{head}".encode()
        transport, _ = await loop.create_connection(functools.partial(Watcher, tally, task_id, request), host, port)
        transports.append(transport)
    if count:
        await asyncio.wait_for(tally.all_answered, timeout=120)
    refused = sum(tally.refused.values())
    print(f"ready {count - refused} {refused}", flush=True)
    cpu0 = cpu_seconds()
    started = time.perf_counter()
    await loop.run_in_executor(None, sys.stdin.readline)  # "stop"
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu0
    for transport in transports:
        transport.close()
    delays = sorted(tally.delays)
    return {
        "watchers": count, "refused": dict(tally.refused), "ended_by_server": tally.ended,
        "events": len(delays), "events_per_task": dict(tally.events), "coalesced": tally.skipped,
        "delay_p50_ms": round(percentile(delays, 50) * 1000, 1),
        "delay_p99_ms": round(percentile(delays, 99) * 1000, 1),
        "delay_max_ms": round(delays[-1] * 1000, 1) if delays else 0.0,
        "late_over_1s": sum(1 for d in delays if d > 1.0),
        "cpu_share": round(cpu / seconds, 3) if seconds else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids", type=Path, required=True, help="file with one task id a line")
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    ids = args.ids.read_text().split()
    result = asyncio.run(watch(args.host, args.port, ids, args.count))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
