"""What a durable checkpoint costs in Redis (workers/checkpoint.py): the bytes of a task's checkpoint log
(``MEMORY USAGE`` of its key) once 10,000 items are done, on the bench's real Redis, through the runner's own
path (TaskContext -> TaskStore.report -> the progress script). Two write rates: one write a second with 100
items a second (the default throttle on a loop of 10 ms items), and a write per item (the worst case:
TASKPORT_PROGRESS_INTERVAL 0). Items return None (most processors) or an integer (results kept for
``ctx.each``). Also a row of ``make bench`` (its part "memory").

    .venv/bin/python bench/checkpoint.py    # needs REDIS_URL, or runs its own embedded server
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

ITEMS = 10_000


class StepClock:
    """A monotonic clock that moves ``step`` seconds each time it is read: items of a known duration."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def checkpoint_bytes(conn: Any, config: Any, interval: float, result: Any) -> int:
    """MEMORY USAGE of one task's checkpoint key after ITEMS items at one write per ``interval`` s of 10 ms items."""
    from app.core import keys
    from app.core.answers import NewTask
    from app.core.results import LocalResultStore
    from app.core.store import TaskStore
    from workers.context import TaskContext

    store = TaskStore(conn, config)
    task_id = str(uuid.uuid4())
    store.create(NewTask(task_id, "bench", "demo.sleep", {}, uuid.uuid4().hex, "default", 1))
    run_id = uuid.uuid4().hex
    assert store.start(task_id, run_id).started is not None

    def report(progress: int | None, message: str, items: dict | None, saved: Any) -> str:
        if saved is None:
            return store.report(task_id, run_id, progress, message, items)
        return store.report(task_id, run_id, progress, message, items, checkpoint=saved.line, cursor=saved.cursor,
                            replace=saved.replace)

    ctx = TaskContext(task_id, report, results=LocalResultStore(Path(config.data_dir) / "bench-results"),
                      interval=interval, clock=StepClock(0.01))
    ctx.each(range(ITEMS), lambda i: result if result is None else i)
    ctx.flush()
    used = int(conn.memory_usage(keys.checkpoint(task_id)) or 0)
    store.cancel(task_id)  # drops the checkpoint with the task's payload
    return used


def measure(conn: Any, config: Any) -> dict[str, Any]:
    """Bytes per 10,000 items done, by write rate and kind of result."""
    return {f"{rate}, {kind}": checkpoint_bytes(conn, config, interval, result)
            for rate, interval in (("a write a second", 1.0), ("a write per item", 0.0))
            for kind, result in (("null results", None), ("integer results", 0))}


def main() -> None:
    import os

    from app.core.config import Config
    from app.core.connection import connect
    from bench.stack import Stack

    if os.environ.get("REDIS_URL"):
        config = Config.from_env()
        print(measure(connect(config), config))
        return
    with Stack() as stack:
        print(measure(stack.client(), stack.config))


if __name__ == "__main__":
    main()
