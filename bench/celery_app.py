"""The peer of ``make bench``: a Celery 5 app with one no-op task, broker and result backend on the
bench's embedded Redis (``BENCH_CELERY_REDIS``). Its worker runs as ``celery -A bench.celery_app worker``
(Celery's defaults: prefork, one child per CPU) and Flower 2 in front of it as
``celery -A bench.celery_app flower``; the bench drives Flower's REST API (task apply, task result).
"""

from __future__ import annotations

import os

from celery import Celery

REDIS_URL = os.environ.get("BENCH_CELERY_REDIS", "redis://127.0.0.1:6379/0")
NOOP = "bench.celery_app.noop"

app = Celery("bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    result_expires=3600,
    worker_hijack_root_logger=False,
)


@app.task(name=NOOP)
def noop(n: int = 0) -> None:
    """Return at once (the peer of ``demo.sleep`` with seconds 0 and of bare RQ's ``bench.noop.noop``)."""
