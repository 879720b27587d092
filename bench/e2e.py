"""End to end over HTTP, in its own process: N no-op tasks submitted from C keep-alive clients, then
polled until every one is done; the answer is one JSON line (tasks/s = N / time from the first submit
to the last task seen done).

    python -m bench.e2e --port 8000 --peer taskport --tasks 2000 --conns 16
    python -m bench.e2e --port 5555 --peer celery --tasks 2000 --conns 16     # Flower's REST API (task result)
    python -m bench.e2e --port 5555 --peer celery-info --tasks 2000 --conns 16    # polled by Flower's task info
    python -m bench.e2e --port 8000 --peer taskport --tasks 20000 --conns 4 --batch 1000   # 20 batches

Each client takes the next number from a shared counter until N are submitted (so the load follows the
server), then polls the tasks it submitted, one GET at a time, sweep after sweep, with a 50 ms pause
after each sweep (the same for both peers), until all are done. A task that ends any other way
(FAILED, FAILURE...) is counted as an error, not as done.

With ``--batch B`` (taskport only) the counter hands out batches instead: each client submits the next
batch of B tasks (``POST /api/v1/batches``) until N tasks are in, then polls its batches' documents
(``GET /api/v1/batches/{id}``, the same 50 ms pause per sweep) until each is DONE; a batch whose tasks did
not all end COMPLETED counts its others as errors. Besides the time to the last task *seen* done, the
answer carries ``started_epoch`` (wall clock of the first request) and, in batch mode,
``last_completed_epoch``: the latest ``completed_at`` of the batch documents, i.e. when the last task of
all became COMPLETED as the server recorded it (the bench reads the Celery side's from its result backend).
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
from datetime import datetime
from typing import Any

from bench.loadgen import batch_body

SWEEP_PAUSE = 0.05
BATCHES, BATCH_PATH = "/api/v1/batches", "/api/v1/batches/%s"


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
    # the same, polled through Flower's in-memory state (fed by the worker's events; 404 until it hears of one)
    "celery-info": Peer("/api/task/async-apply/bench.celery_app.noop", '{"args":[%d]}', 200, "task-id",
                        "/api/task/info/%s", "state", "SUCCESS", ("FAILURE", "REVOKED")),
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
        try:
            return status, json.loads(data) if data else None
        except ValueError:  # not JSON: e.g. Flower's HTML 404 for a task it has not heard of yet
            return status, data[:200].decode(errors="replace")


async def client(host: str, port: int, peer: Peer, counter: itertools.count, total: int, base: int,
                 stats: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    conn = Conn(reader, writer, f"{host}:{port}")
    mine: list[str] = []
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


def payload_base() -> int:
    """The first payload number of a run, shared by all its clients (each takes numbers from one counter), so
    every payload of the run is unique and dedup never hits; runs differ by the clock."""
    return int(time.time() * 1000) % 1_000_000 * 1_000_000


def epoch(stamp: str) -> float:
    """An ISO 8601 time of a document (``2026-12-02T03:32:44.723Z``) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def batch_client(host: str, port: int, counter: itertools.count, total: int, size: int, base: int,
                       stats: dict[str, Any]) -> None:
    """Submit the next batch of ``size`` until ``total`` tasks are in, then poll this client's batches until
    each is DONE (taskport only)."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = Conn(reader, writer, f"{host}:{port}")
    mine: dict[str, int] = {}
    while (first := next(counter) * size) < total:
        n = min(size, total - first)
        status, doc = await conn.call("POST", BATCHES, batch_body(base + first, n))
        if status != 202:
            stats["errors"].append(f"batch submit {status}: {str(doc)[:200]}")
            continue
        mine[str(doc["batch_id"])] = n
    stats["submitted_at"] = max(stats["submitted_at"], time.perf_counter())
    while mine:
        for batch_id in list(mine):
            stats["polls"] += 1
            status, doc = await conn.call("GET", BATCH_PATH % batch_id)
            if status != 200 or not isinstance(doc, dict) or doc.get("status") != "DONE":
                continue
            n = mine.pop(batch_id)
            completed = int(doc["counts"]["COMPLETED"])
            stats["done"] += completed
            if completed < n:
                stats["errors"].append(f"batch {batch_id}: {n - completed} of {n} tasks did not complete: "
                                       f"{doc['counts']}")
            stats["last_done"] = time.perf_counter()
            stats["last_completed_epoch"] = max(stats["last_completed_epoch"], epoch(doc["completed_at"]))
        if mine:
            await asyncio.sleep(SWEEP_PAUSE)
    writer.close()


async def drive(host: str, port: int, peer_name: str, total: int, conns: int, timeout: float,
                batch: int = 0) -> dict[str, Any]:
    peer = PEERS[peer_name]
    stats: dict[str, Any] = {"done": 0, "polls": 0, "errors": [], "submitted_at": 0.0, "last_done": 0.0,
                             "last_completed_epoch": 0.0}
    counter = itertools.count()
    base = payload_base()
    started_epoch, started = time.time(), time.perf_counter()
    clients = [batch_client(host, port, counter, total, batch, base, stats) if batch else
               client(host, port, peer, counter, total, base, stats) for _ in range(conns)]
    try:
        await asyncio.wait_for(asyncio.gather(*clients), timeout)
        timed_out = False
    except TimeoutError:
        timed_out = True
    ended = stats["last_done"] if not timed_out else time.perf_counter()
    seconds = ended - started
    found = {"peer": peer_name, "tasks": total, "done": stats["done"], "timed_out": timed_out,
             "seconds": round(seconds, 3), "tasks_per_s": round(stats["done"] / seconds, 1) if seconds else 0.0,
             "submit_seconds": round(stats["submitted_at"] - started, 3), "polls": stats["polls"],
             "errors": stats["errors"][:20], "error_count": len(stats["errors"]), "conns": conns,
             "started_epoch": started_epoch, "pid": os.getpid()}
    if batch:
        found["batch"] = batch
        found["last_completed_epoch"] = stats["last_completed_epoch"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--batch", type=int, default=0, help="tasks per batch (POST /api/v1/batches; taskport only)")
    args = parser.parse_args(argv)
    if args.batch and args.peer != "taskport":
        parser.error("--batch: only taskport has a batch endpoint")
    result = asyncio.run(drive(args.host, args.port, args.peer, args.tasks, args.conns, args.timeout, args.batch))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
