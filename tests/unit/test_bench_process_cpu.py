"""bench/process_cpu.py counts a process group's CPU from /proc, children included; bench/cpu_report.py's verdicts."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from bench.cpu_report import before_after_rows, commands_row
from bench.process_cpu import TOTAL, descendants, measured, per_op
from tests.integration.harness import wait_until

BUSY = "sum(range(4_000_000))"


def _own_and_children() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def test_a_child_that_exits_inside_the_window_is_counted_whole_and_once() -> None:
    children0, ours0 = resource.getrusage(resource.RUSAGE_CHILDREN), _own_and_children()
    _, cpu = measured({"me": [os.getpid()]}, lambda: subprocess.run([sys.executable, "-c", BUSY], check=True))
    children1, ours = resource.getrusage(resource.RUSAGE_CHILDREN), _own_and_children() - ours0
    child = children1.ru_utime + children1.ru_stime - children0.ru_utime - children0.ru_stime
    assert child > 0
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert cpu["me"] >= child - 2 * tick  # the reaped child is in the window's CPU...
    assert abs(cpu["me"] - ours) <= 4 * tick  # ...and nothing is counted twice


def test_a_live_grandchild_is_part_of_the_group() -> None:
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: len(descendants(parent.pid)) == 2, timeout=30, message="the grandchild to start")
        assert descendants(parent.pid)[0] == parent.pid
    finally:
        for pid in reversed(descendants(parent.pid)):
            os.kill(pid, 9)
        parent.wait()


def test_per_op_gives_each_group_and_their_sum() -> None:
    assert per_op({"web": 0.5, "redis": 0.25}, 1000) == {"web": 0.5, "redis": 0.25, TOTAL: 0.75}


def _side(web: float, redis: float, workers: float, commands: float) -> dict[str, object]:
    def cpu(**groups: float) -> dict[str, float]:
        return {**groups, TOTAL: sum(groups.values())}

    return {"submit": {"cpu_ms_per_op": cpu(web=web, redis=redis)},
            "status": {"cpu_ms_per_op": cpu(web=web, redis=redis)},
            "delivery": {"cpu_ms_per_op": cpu(workers=workers, redis=redis), "commands_per_delivery": commands}}


def test_before_after_rows_hold_the_after_side_to_issue_32s_ratios() -> None:
    found = {"before_commit": "139e736", "before": _side(1.0, 0.2, 2.0, 71), "after": _side(0.69, 0.17, 1.3, 20)}
    targets = [(r.measure.split(" (")[0], r.target, r.ratio, r.verdict) for r in before_after_rows(found) if r.target]
    assert targets == [("CPU per submit", "≤ 0.7×", "0.69×", "PASS"), ("CPU per submit", "≤ 0.8×", "0.85×", "FAIL"),
                       ("CPU per delivery", "≤ 0.6×", "0.65×", "FAIL")]


def test_commands_per_delivery_target_is_25() -> None:
    def row(n: float) -> str:
        return commands_row({"taskport": {"commands_total": n}, "bare_rq": {"commands_total": 57}}).verdict

    assert (row(25), row(25.5)) == ("PASS", "FAIL")
