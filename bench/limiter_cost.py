"""What the request-rate limiter costs the web per request (issue 23; not part of ``make bench``): in-process, on a
scratch embedded Redis, well under a minute.

    .venv/bin/python bench/limiter_cost.py [--requests 1000] [--rounds 3]

The WSGI app through Flask's test client (no HTTP server: the app's own work), with API keys, one member's
``GET /api/v1/tasks`` (a page of her empty history) ``--requests`` times after 20 warm-ups; the web's CPU
(``time.process_time``) per request, median of ``--rounds``, for: the limiter off, a limit the requests never
reach (every one counted and served), and a limit of 5 a minute (every request after the fifth refused, 429).
``make bench`` runs in open mode, where the limiter is off: a deployment with API keys has it on by default
(``TASKPORT_RATE_LIMIT``, docs/api.md#quotas), so this is a cost its rows do not show.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core.config import Config  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402
from app.web import create_app  # noqa: E402

CASES = {  # label -> TASKPORT_RATE_LIMIT
    "limiter off": "off",
    "counted, under the limit (200)": "1000000/minute",
    "refused (429)": "5/minute",
}
KEY = "ka"


def cpu_per_request(config: Config, server: EmbeddedRedis, limit: str, requests: int) -> tuple[int, float]:
    """(the last answer's status, CPU ms per request) for one limiter setting, on a flushed Redis."""
    conn = server.client(timeout=60)
    conn.flushall()
    client = create_app(replace(config, rate_limit=limit), conn=conn).test_client()
    headers = {"Authorization": f"Bearer {KEY}"}
    for _ in range(20):
        client.get("/api/v1/tasks", headers=headers)
    began = time.process_time()
    for _ in range(requests):
        status = client.get("/api/v1/tasks", headers=headers).status_code
    return status, (time.process_time() - began) / requests * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    rows: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tp-limiter-") as tmp:
        base = Config.from_env({}, data_dir=Path(tmp), api_keys=f"{KEY}:alice")
        with EmbeddedRedis(base) as server:
            config = replace(base, redis_url=server.url)
            for label, limit in CASES.items():
                runs = [cpu_per_request(config, server, limit, args.requests) for _ in range(args.rounds)]
                rows[label] = (runs[-1][0], statistics.median(ms for _, ms in runs))
    print("| GET /api/v1/tasks, one member | answer | web CPU ms per request |\n| --- | --- | --- |")
    for label, (status, ms) in rows.items():
        print(f"| {label} | {status} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
