"""Status reads against how many tasks Redis holds (issue 23): req/s of ``GET /api/v1/tasks/{id}`` with
1,000 finished tasks stored, then with 1,000,000, through the running gunicorn and bench.loadgen.

The tasks are copies of one task run to COMPLETED through the product's own TaskStore (create, start,
complete): its hash, with its TTL, under a fresh id each, and its entries in the member's history and the
expiry index, so Redis's tables hold what a million finished tasks put there (their audit entries, which
a read never touches, are left out). Writing them through the scripts would take minutes; copying takes
seconds and gives the reads the same keys to find. With 1,000 stored, the reads cycle over all of them;
with 1,000,000, over :data:`READ_IDS` drawn at random from the million, so that a read finds its key
where a million keys spread it, not among the few the first case reads. The two cases cannot alternate
(the million is written once, after the 1,000's rounds): best of ``rounds`` each, as every HTTP row.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from app.core import keys, processors
from app.core.store import TaskStore
from bench.fill import new_task
from bench.measure_http import best, clean_slate, loadgen
from bench.stack import Stack

SMALL, LARGE = 1_000, 1_000_000
READ_IDS = 20_000  # ids the 1,000,000 case reads, drawn from all of them
CHUNK = 5_000  # tasks per pipeline while copying


def finished_template(conn: redis.Redis, store: TaskStore) -> tuple[dict[bytes, bytes], int]:
    """One no-op task run to COMPLETED through the store: its hash and its TTL (ms)."""
    processors.load()
    new = new_task(0, base=60_000_000)
    store.create(new)
    run_id = uuid.uuid4().hex
    store.start(new.task_id, run_id)
    store.complete(new.task_id, run_id, {"slept": 0, "items": 0}, items=None, failures=[], error_code=None)
    key = keys.task(new.task_id)
    return dict(conn.hgetall(key)), int(conn.pttl(key))


def copy_tasks(conn: redis.Redis, template: dict[bytes, bytes], ttl_ms: int, n: int) -> list[str]:
    """``n`` copies of the template under fresh ids, in the member's history and the expiry index."""
    member = template[keys.TaskField.MEMBER.encode()].decode()
    created = int(template[keys.TaskField.CREATED_AT.encode()])
    expires = int(template[keys.TaskField.EXPIRES_AT.encode()])
    ids: list[str] = []
    for start in range(0, n, CHUNK):
        pipe = conn.pipeline(transaction=False)
        chunk = [str(uuid.uuid4()) for _ in range(min(CHUNK, n - start))]
        for task_id in chunk:
            pipe.hset(keys.task(task_id), mapping=template)  # type: ignore[arg-type]
            pipe.pexpire(keys.task(task_id), ttl_ms)
        pipe.zadd(keys.history(member), {task_id: created for task_id in chunk})
        pipe.zadd(keys.EXPIRY, {task_id: expires for task_id in chunk})
        pipe.execute()
        ids += chunk
    return ids


def quiesce(conn: redis.Redis, timeout: float = 300.0) -> None:
    """Until Redis runs no background save or AOF rewrite (a million writes start one, a forked child that
    copies the dataset and takes one of the machine's cores for seconds): the reads are measured on a
    settled server, not beside what the fill set off."""
    deadline = time.monotonic() + timeout
    busy = ("aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress")
    while True:
        info = conn.info("persistence")  # one read a turn, every flag from it
        if not any(int(info.get(flag, 0)) for flag in busy):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Redis still saving {timeout} s after the fill")
        time.sleep(0.2)


def status_by_stored(stack: Stack, conns: int, warmup: float, duration: float, rounds: int,
                     large: int = LARGE) -> dict[str, Any]:
    """Best-of-``rounds`` status reads with SMALL finished tasks stored, then with ``large``."""
    conn = stack.client()
    clean_slate(conn)
    template, ttl_ms = finished_template(conn, TaskStore(conn, stack.config))
    ids_file = stack.dir / "stored-ids.txt"
    out: dict[str, Any] = {}
    for name, stored in (("small", SMALL), ("large", large)):
        ids = copy_tasks(conn, template, ttl_ms, stored - int(conn.zcard(keys.EXPIRY)))
        if stored == SMALL:
            read = ids
        else:
            every = [i.decode() for i in conn.zrange(keys.EXPIRY, 0, -1)]
            read = random.Random(23).sample(every, min(READ_IDS, len(every)))
        Path(ids_file).write_text("\n".join(read))
        quiesce(conn)
        found = [loadgen(stack.config.port, "status", conns=conns, warmup=warmup if i == 0 else min(warmup, 1.0),
                         duration=duration, ids_file=str(ids_file), env=stack.environ()) for i in range(rounds)]
        out[name] = {**best(found), "stored": int(conn.zcard(keys.EXPIRY)), "distinct_read": len(read),
                            "used_memory": int(conn.info("memory")["used_memory"])}
    conn.flushall()
    conn.close()
    return out
