"""How busy the machine was with work that is not the bench's own (other sessions, builds, tests).

The bench shares the machine's cores with whatever else runs; that skews every figure, and the
baselines beside each figure only partly cancel it. This compares the CPU the whole machine spent
(``/proc/stat``) with the CPU the bench and all of its reaped children spent (``getrusage``).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass


def _machine_busy() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (0.0 where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _ours() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclass
class CpuWatch:
    started: float = 0.0
    busy0: float = 0.0
    ours0: float = 0.0

    def start(self) -> CpuWatch:
        self.started, self.busy0, self.ours0 = time.monotonic(), _machine_busy(), _ours()
        return self

    def report(self) -> dict[str, float]:
        """Call once every child has been reaped (their CPU only counts then)."""
        elapsed = time.monotonic() - self.started
        cpus = os.cpu_count() or 1
        busy, ours = _machine_busy() - self.busy0, _ours() - self.ours0
        other = max(0.0, busy - ours)
        return {"elapsed_s": round(elapsed, 1), "machine_busy_cpu_s": round(busy, 1), "bench_cpu_s": round(ours, 1),
                "other_cpu_s": round(other, 1), "other_share_of_machine": round(other / (elapsed * cpus), 3),
                "loadavg_1m_end": round(os.getloadavg()[0], 2)}


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) spent so far by ``pid`` and its children, e.g. gunicorn's master and
    workers: a figure that, unlike throughput, other work on the machine does not skew (0.0 if gone)."""
    total = 0.0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
