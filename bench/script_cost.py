"""Each of a delivery's three scripts alone: its Redis time per call, and how much of it the commands inside take.

``INFO commandstats`` gives EVALSHA's usec per call (the whole script, the commands it runs included) and each
command's own usec; the difference is the script's own cost: its Lua (the preamble and the functions its fragments
define, on every call), ``redis.call``'s conversions and the propagation of its writes (the AOF). Run against one
valkey-server started for it (``bench.stack.Stack``), n tasks each: CLAIM takes from a backlog (its claim cleared
as the start pipeline does), START starts PENDING tasks, TRANSITION completes them (without RQ's end of the job,
which the simple worker adds: 3 commands). bench/README.md, "The claim's second round".

    .venv/bin/python bench/script_cost.py [n]
    cd <another tree> && PYTHONPATH=. <this venv>/bin/python <this file>   # the same for another commit's scripts
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the tree it runs in (cwd), so another commit's scripts can be measured

import redis  # noqa: E402

from app.core import keys  # noqa: E402
from app.core.config import Config  # noqa: E402
from app.core.jobclaims import Claims  # noqa: E402
from app.core.states import QUEUES  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from bench.fill import create_tasks  # noqa: E402
from bench.stack import Stack  # noqa: E402


def _report(conn: redis.Redis, label: str, n: int, skip: tuple[str, ...] = ()) -> None:
    stats: Any = conn.info("commandstats")
    per = {k[len("cmdstat_"):]: (v["calls"] / n, v["usec"] / n) for k, v in stats.items()}
    script = per["evalsha"][1]
    inside = {k: v for k, v in per.items() if k != "evalsha" and k not in skip}
    usec = sum(u for _, u in inside.values())
    calls = sum(c for c, _ in inside.values())
    print(f"{label:10s} {script:6.1f} us a call; {calls:4.1f} commands inside, {usec:5.1f} us of them; "
          f"the script's own {script - usec:5.1f} us")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with Stack() as stack:
        url = stack.redis_server.url
        config = Config.from_env({}, data_dir=tempfile.mkdtemp(prefix="script-cost-"), redis_url=url, api_keys="")
        conn = redis.Redis.from_url(url, socket_timeout=30)
        create_tasks(conn, config, n + 1, enqueue=True, base=70_000_000)
        claims, pairs = Claims(conn), [(q, "rq:queue:" + q) for q in QUEUES]
        claims.take("w", pairs)  # the claimants' SADD: once a minute, not a take's
        conn.delete(keys.job_claims("w"))
        conn.config_resetstat()
        for _ in range(n):
            claims.take("w", pairs)
            conn.delete(keys.job_claims("w"))  # top-level: left out below
        _report(conn, "CLAIM", n, skip=("del",))
        conn.flushall()
        ids = create_tasks(conn, config, n, enqueue=False, base=80_000_000)
        store = TaskStore(conn, config)
        conn.config_resetstat()
        for i, task_id in enumerate(ids):
            store.start(task_id, f"run{i}")
        _report(conn, "START", n)
        conn.config_resetstat()
        for i, task_id in enumerate(ids):
            store.complete(task_id, f"run{i}", None, items=None, failures=[], error_code=None)
        _report(conn, "TRANSITION", n)


if __name__ == "__main__":
    main()
