"""Worker memory over many tasks: the RSS of one taskport worker process while it runs N no-op tasks.

    .venv/bin/python bench/worker_memory.py                    # 100,000 tasks, simple worker, no recycling
    .venv/bin/python bench/worker_memory.py --tasks 20000 --worker-class fork

Not part of ``make bench`` (100,000 tasks take several minutes). One worker (``python -m app.launch.cli worker``)
with ``TASKPORT_WORKER_MAX_JOBS=0`` (never recycled, so growth would show) on the bench's stack; tasks
are created and queued in batches of 10,000 through the product's own ``TaskStore.create`` +
``JobQueue.job_commands``; after each batch is done the worker's VmRSS (``/proc/<pid>/status``) is read.
For the fork class the figure is the worker's own (each work horse is a fresh fork that exits).
Prints one JSON line per sample and a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core import keys  # noqa: E402
from bench.fill import create_tasks  # noqa: E402
from bench.stack import Stack  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--worker-class", default="simple", choices=("simple", "fork"))
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (the worker's log)")
    args = parser.parse_args(argv)
    with Stack(keep=args.keep) as stack:
        stack.config = replace(stack.config, worker_max_jobs=0)
        conn = stack.client()
        [worker] = stack.start_workers(args.worker_class, 1)
        pid = worker.popen.pid
        samples = [{"done": 0, "rss_mib": round(rss_kib(pid) / 1024, 1)}]
        print(json.dumps(samples[0]), flush=True)
        started = time.perf_counter()
        done = 0
        while done < args.tasks:
            n = min(args.batch, args.tasks - done)
            create_tasks(conn, stack.config, n, enqueue=True, base=done)
            done += n
            while int(conn.hget(keys.STATS, "completed") or 0) < done:
                if not worker.alive:
                    raise RuntimeError(f"the worker exited ({worker.popen.returncode}):\n{worker.tail()}")
                time.sleep(0.5)
            samples.append({"done": done, "rss_mib": round(rss_kib(pid) / 1024, 1),
                            "elapsed_s": round(time.perf_counter() - started, 1)})
            print(json.dumps(samples[-1]), flush=True)
        first, after_first, last = samples[0], samples[1], samples[-1]
        print(json.dumps({"worker_class": args.worker_class, "tasks": done, "rss_start_mib": first["rss_mib"],
                          "rss_after_first_batch_mib": after_first["rss_mib"], "rss_end_mib": last["rss_mib"],
                          "growth_after_first_batch_mib": round(last["rss_mib"] - after_first["rss_mib"], 1),
                          "seconds": last["elapsed_s"]}))
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
