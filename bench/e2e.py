"""End to end over HTTP, in its own process: N no-op tasks submitted from C keep-alive clients, then
polled until every one is done; the answer is one JSON line (tasks/s = N / time from the first submit
to the last task seen done).

    python -m bench.e2e --port 8000 --peer taskport --tasks 2000 --conns 16
    python -m bench.e2e --port 5555 --peer celery --tasks 2000 --conns 16     # Flower's REST API

Each client takes the next number from a shared counter until N are submitted (so the load follows the
server), then polls the tasks it submitted, one GET at a time, sweep after sweep, with a 50 ms pause
after each sweep (the same for both peers), until all are done. A task that ends any other way
(FAILED, FAILURE...) is counted as an error, not as done.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

SWEEP_PAUSE = 0.05


@dataclass(frozen=True)
class Peer:
    submit_path: str
    body: str  # % the task's number
    submitted_status: int
    id_field: str
    status_path: str  # % the id
    state_field: str
    done: str
    failed: tuple[str, ...]


PEERS = {
    "taskport": Peer("/api/v1/tasks", '{"type":"demo.sleep","payload":{"seconds":0,"steps":1,"fail_items":[%d]}}',
                     202, "task_id", "/api/v1/tasks/%s", "status", "COMPLETED", ("FAILED", "CANCELLED", "EXPIRED")),
    "celery": Peer("/api/task/async-apply/bench.celery_app.noop", '{"args":[%d]}', 200, "task-id",
                   "/api/task/result/%s", "state", "SUCCESS", ("FAILURE", "REVOKED")),
}


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nUser-Agent: taskport-bench\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lower = raw.lower()
        status = int(raw[9:12])
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError("response without Content-Length")
        length = int(lower[at + 17: lower.find(b"\r\n", at + 2)])
        data = await self.reader.readexactly(length)
        return status, json.loads(data) if data else None


async def client(host: str, port: int, peer: Peer, counter: itertools.count, total: int,
                 stats: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    conn = Conn(reader, writer, f"{host}:{port}")
    mine: list[str] = []
    base = int(time.time() * 1000) % 1_000_000 * 10_000
    while (n := next(counter)) < total:
        status, doc = await conn.call("POST", peer.submit_path, (peer.body % (base + n)).encode())
        if status != peer.submitted_status:
            stats["errors"].append(f"submit {status}: {str(doc)[:200]}")
            continue
        mine.append(str(doc[peer.id_field]))
    stats["submitted_at"] = max(stats["submitted_at"], time.perf_counter())
    pending = mine
    while pending:
        left = []
        for task_id in pending:
            stats["polls"] += 1
            status, doc = await conn.call("GET", peer.status_path % task_id)
            state = doc.get(peer.state_field) if status == 200 and isinstance(doc, dict) else None
            if state == peer.done:
                stats["done"] += 1
                stats["last_done"] = time.perf_counter()
            elif state in peer.failed:
                stats["errors"].append(f"task {task_id} ended {state}")
            else:
                left.append(task_id)
        pending = left
        if pending:
            await asyncio.sleep(SWEEP_PAUSE)
    writer.close()


async def drive(host: str, port: int, peer_name: str, total: int, conns: int, timeout: float) -> dict[str, Any]:
    peer = PEERS[peer_name]
    stats: dict[str, Any] = {"done": 0, "polls": 0, "errors": [], "submitted_at": 0.0, "last_done": 0.0}
    counter = itertools.count()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(client(host, port, peer, counter, total, stats)
                                                for _ in range(conns))), timeout)
        timed_out = False
    except TimeoutError:
        timed_out = True
    ended = stats["last_done"] if not timed_out else time.perf_counter()
    seconds = ended - started
    return {"peer": peer_name, "tasks": total, "done": stats["done"], "timed_out": timed_out,
            "seconds": round(seconds, 3), "tasks_per_s": round(stats["done"] / seconds, 1) if seconds else 0.0,
            "submit_seconds": round(stats["submitted_at"] - started, 3), "polls": stats["polls"],
            "errors": stats["errors"][:20], "error_count": len(stats["errors"]), "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    result = asyncio.run(drive(args.host, args.port, args.peer, args.tasks, args.conns, args.timeout))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
