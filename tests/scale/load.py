"""The client host's steady load on the bed: submits, polls and SSE watchers, counted per answer.

    python -m tests.scale.load --web http://10.231.0.31:8000,http://10.231.0.32:8000 --key k1 \\
        --duration 20 --out load.json [--go FILE] [--settle 120]

Runs on the bed's ``client`` host (``Bed.spawn``), like a user's frontend would: submitters at a steady
pace over both web hosts (a web host that refuses connections is skipped for the other, as a load
balancer would), a poller reading acknowledged tasks, and SSE watchers on some of them that reconnect
with ``Last-Event-ID`` when their stream breaks. ``--go FILE``: the load starts once FILE exists, and the
script writes ``<out>.ready`` when it is up, so the test can await both instead of sleeping.

When the load ends, every acknowledged task (202) is polled until it is terminal or ``--settle`` runs
out, and one JSON document goes to ``--out``: what was acknowledged, how each acknowledged task ended
(``FAILED -3`` with its error code; ``lost`` = the service answers 404 for an id it acknowledged), the
503s (each with its Retry-After or counted as missing one), any other 5xx (there must be none), the
longest request, when the 503s began and ended (the gap clients saw), and what the watchers received.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
REQUEST_TIMEOUT = 10.0  # seconds: the longest any one request may take before it counts as a hang
READY_TIMEOUT = 60.0  # seconds the web hosts get to answer /readyz with 200


class Tally:
    """Everything the threads observe, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: list[str] = []
        self.codes: Counter[str] = Counter()
        self.no_retry_after = 0
        self.server_errors: list[str] = []
        self.longest = 0.0
        self.first_503: float | None = None
        self.last_ack = 0.0  # seconds into the load of the last 202
        self.last_503: float | None = None
        self.refused: Counter[str] = Counter()
        self.watched: dict[str, str | None] = {}

    def answer(self, what: str, response: httpx.Response, took: float, t0: float) -> None:
        with self.lock:
            self.codes[f"{what} {response.status_code}"] += 1
            self.longest = max(self.longest, took)
            if response.status_code == 503:
                now = time.monotonic() - t0
                self.first_503 = now if self.first_503 is None else self.first_503
                self.last_503 = now
                if not response.headers.get("Retry-After", "").isdigit():
                    self.no_retry_after += 1
            elif response.status_code >= 500:
                self.server_errors.append(f"{what} {response.status_code} {response.text[:200]}")


class Load:
    def __init__(self, args: argparse.Namespace) -> None:
        self.webs = args.web.split(",")
        self.headers = {"Authorization": f"Bearer {args.key}"}
        self.args = args
        self.tally = Tally()
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.serial = itertools.count(random.randrange(1 << 30))

    def request(self, client: httpx.Client, what: str, method: str, path: str, **kw: Any) -> httpx.Response | None:
        """One request to the first web host that takes the connection (starting from a rotating one)."""
        start = next(self.serial) % len(self.webs)
        for web in self.webs[start:] + self.webs[:start]:
            began = time.monotonic()
            try:
                response = client.request(method, web + path, headers=self.headers, **kw)
            except httpx.TransportError as exc:
                with self.tally.lock:
                    self.tally.refused[f"{web} {type(exc).__name__}"] += 1
                continue
            self.tally.answer(what, response, time.monotonic() - began, self.t0)
            return response
        return None

    def submitter(self) -> None:
        pace = 1.0 / self.args.rate
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            while not self.stop.is_set():
                body = {"type": "demo.sleep", "payload": {"seconds": self.args.seconds, "steps": self.args.steps,
                                                          "fail_items": [next(self.serial)]}}
                response = self.request(client, "submit", "POST", "/api/v1/tasks", json=body)
                if response is not None and response.status_code == 202:
                    task_id = response.json()["task_id"]
                    with self.tally.lock:
                        self.tally.acked.append(task_id)
                        self.tally.last_ack = time.monotonic() - self.t0
                        watch = (len(self.tally.acked) % self.args.watch_every == 1
                                 and len(self.tally.watched) < self.args.watchers)
                        if watch:
                            self.tally.watched[task_id] = None
                    if watch:
                        threading.Thread(target=self.watcher, args=(task_id,), daemon=True).start()
                self.stop.wait(pace)

    def poller(self) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            while not self.stop.is_set():
                with self.tally.lock:
                    ids = self.tally.acked[-50:]
                if ids:
                    self.request(client, "status", "GET", f"/api/v1/tasks/{random.choice(ids)}")
                self.stop.wait(0.05)

    def watcher(self, task_id: str) -> None:
        """Follow one task's events to its terminal one, reconnecting with Last-Event-ID."""
        last_id = ""
        deadline = time.monotonic() + self.args.duration + self.args.settle
        with httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT, read=60)) as client:
            for attempt in itertools.count(next(self.serial)):
                if time.monotonic() > deadline:
                    return
                web = self.webs[attempt % len(self.webs)]  # the next web host after each break
                headers = {**self.headers, **({"Last-Event-ID": last_id} if last_id else {})}
                try:
                    with connect_sse(client, "GET", f"{web}/api/v1/tasks/{task_id}/events", headers=headers) as es:
                        if es.response.status_code != 200:
                            time.sleep(0.5)  # a 503 during the gap: come back as Retry-After asks (shortened)
                            continue
                        for event in es.iter_sse():
                            last_id = event.id or last_id
                            if not event.data:
                                continue  # a retry: field alone
                            status = json.loads(event.data).get("status")
                            if status in TERMINAL:
                                with self.tally.lock:
                                    self.tally.watched[task_id] = status
                                return
                except (httpx.TransportError, httpx.StreamError):
                    time.sleep(0.2)  # a broken stream: reconnect with Last-Event-ID

    def settle(self) -> tuple[dict[str, str], Counter[int]]:
        """Poll every acknowledged task until it is terminal (or ``--settle`` is over): how each ended, and
        how many attempts the ended ones took."""
        ended: dict[str, str] = {}
        attempts: Counter[int] = Counter()
        deadline = time.monotonic() + self.args.settle
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            while time.monotonic() < deadline:
                open_ids = [t for t in self.tally.acked if t not in ended]
                if not open_ids:
                    break
                for task_id in open_ids:
                    response = self.request(client, "settle", "GET", f"/api/v1/tasks/{task_id}")
                    if response is None or response.status_code == 503:
                        continue
                    if response.status_code == 404:
                        ended[task_id] = "lost"
                    elif response.status_code == 200 and (doc := response.json())["status"] in TERMINAL:
                        code = [str(doc["error"]["code"])] if doc["error"] else []
                        ended[task_id] = " ".join([doc["status"], *code])
                        attempts[doc["attempts"]] += 1
                time.sleep(0.5)
        return {task_id: ended.get(task_id, "unfinished") for task_id in self.tally.acked}, attempts

    def await_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Every web host answers /readyz with 200 (Redis reachable, workers listening, housekeeping fresh)."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            for web in self.webs:
                while True:
                    with contextlib.suppress(httpx.TransportError):
                        if client.get(f"{web}/readyz").status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{web}/readyz did not answer 200 within {timeout} s")
                    time.sleep(0.1)

    def run(self) -> dict[str, Any]:
        out = Path(self.args.out)
        threads = [threading.Thread(target=self.submitter) for _ in range(self.args.submitters)]
        threads.append(threading.Thread(target=self.poller))
        self.await_ready()
        Path(f"{out}.ready").write_text("ready\n")
        if self.args.go:
            while not Path(self.args.go).exists():
                time.sleep(0.05)
        self.t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(self.args.duration)
        self.stop.set()
        for t in threads:
            t.join()
        outcomes, attempts = self.settle()
        tally = self.tally
        watch_deadline = time.monotonic() + 15
        while None in tally.watched.values() and time.monotonic() < watch_deadline:
            time.sleep(0.1)  # watchers still reading their terminal event
        return {
            "acked": len(tally.acked), "last_ack_s": round(tally.last_ack, 2),
            "outcomes": dict(Counter(outcomes.values())), "attempts": {str(k): v for k, v in attempts.items()},
            "lost": sorted(t for t, s in outcomes.items() if s == "lost"),
            "codes": dict(tally.codes), "no_retry_after": tally.no_retry_after,
            "server_errors": tally.server_errors[:20], "longest_request_s": round(tally.longest, 3),
            "gap_s": None if tally.first_503 is None else [round(tally.first_503, 2), round(tally.last_503 or 0, 2)],
            "refused": dict(tally.refused),
            "watched": len(tally.watched), "watch_terminal": sum(1 for s in tally.watched.values() if s),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--web", required=True, help="comma list of web base URLs")
    p.add_argument("--key", required=True, help="API key")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    p.add_argument("--rate", type=float, default=10.0, help="submits per second per submitter")
    p.add_argument("--submitters", type=int, default=2)
    p.add_argument("--seconds", type=float, default=0.2, help="each task's demo.sleep seconds")
    p.add_argument("--steps", type=int, default=2, help="each task's demo.sleep steps (a checkpoint after each)")
    p.add_argument("--watchers", type=int, default=40, help="tasks followed over SSE, at most")
    p.add_argument("--watch-every", type=int, default=10, help="follow every n-th acknowledged task")
    p.add_argument("--settle", type=float, default=120.0, help="seconds to wait for acknowledged tasks to end")
    p.add_argument("--go", default="", help="start once this file exists")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result = Load(args).run()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
