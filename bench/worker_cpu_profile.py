"""A real ``taskport worker`` (the default simple class) draining no-op tasks: its CPU per delivery from /proc, and
a py-spy profile of it (``--gil``: where its CPU goes), for bench/README.md "Worker CPU, fourth pass".

``N`` no-op tasks (``bench.fill.create_tasks``: demo.sleep, seconds 0, steps 1) are created and queued on one
valkey-server (``bench.stack.Stack``), then one worker process starts; its CPU (utime + stime of /proc/PID/stat) is
read once 500 tasks completed (imports and start-up left out) and again when all did. Keep ``N`` below
``TASKPORT_WORKER_MAX_JOBS`` (10,000 by default: the worker exits there). Run from a tree (``git archive`` of a
commit) with ``PYTHONPATH`` set to it to measure that commit's worker.

    .venv/bin/python bench/worker_cpu_profile.py 9500 /tmp/w.raw     # then summarize the raw (collapsed) stacks
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script

from app.core import keys  # noqa: E402
from bench.fill import create_tasks  # noqa: E402
from bench.stack import Stack  # noqa: E402

WARM = 500  # completions before the CPU is first read


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9500
    out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/worker-cpu.raw"
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    with Stack() as stack:
        conn = stack.client()
        create_tasks(conn, stack.config, n, enqueue=True)
        worker, = stack.start_workers("simple", 1)
        pid = worker.popen.pid
        recorder = subprocess.Popen([spy, "record", "--pid", str(pid), "--gil", "-r", "1000", "--format", "raw",
                                     "-o", out, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def done() -> int:
            return int(conn.hget(keys.STATS, "completed") or 0)

        deadline = time.monotonic() + 300
        while done() < WARM and time.monotonic() < deadline:
            time.sleep(0.01)
        cpu0, done0 = cpu_seconds(pid), done()
        while done() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu1, done1 = cpu_seconds(pid), done()
        recorder.send_signal(2)
        recorder.wait(60)
    print(f"worker CPU ms per delivery {1000 * (cpu1 - cpu0) / max(1, done1 - done0):.3f} over {done1 - done0} "
          f"deliveries; profile in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
