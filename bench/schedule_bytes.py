"""Redis bytes of a periodic schedule: 1,000 schedules created through ScheduleStore on a Redis of its own.

    .venv/bin/python -m bench.schedule_bytes

Prints MEMORY USAGE of one schedule's hash and the growth of ``used_memory`` per schedule (the hash, the
member's index entry and the due set's entry, with Redis' own overhead). bench/SCHEDULING.md quotes it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import redis

from app.core import keys
from app.core.schedules import ScheduleStore
from tests.integration.harness import RedisServer

SCHEDULES = 1000
TASK = {"type": "demo.sleep", "payload": {"seconds": 1}, "priority": "default"}


def main() -> None:
    server = RedisServer(Path(tempfile.mkdtemp(prefix="taskport-schedule-bytes-"))).start()
    try:
        conn = redis.Redis.from_url(server.url)
        store = ScheduleStore(conn, 0)
        before = conn.info("memory")["used_memory"]
        ids = [store.create("alice", name="nightly export", cron_expr="*/15 * * * *", timezone="Europe/Berlin",
                            task=TASK, paused=False, now=int(time.time() * 1000)).id for _ in range(SCHEDULES)]
        grown = conn.info("memory")["used_memory"] - before
        print(f"schedule hash: {conn.memory_usage(keys.schedule(ids[0]))} B (MEMORY USAGE); "
              f"used_memory per schedule: {grown / SCHEDULES:,.0f} B over {SCHEDULES:,}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
