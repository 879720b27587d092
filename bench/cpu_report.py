"""The CPU-per-operation figures (issue 32): RESULTS.md's headline table, the before/after rows, the targets.

Every figure is CPU ms per operation of a process group (``bench.process_cpu``), the least of a figure's
rounds. taskport's groups are ``web`` (gunicorn and its workers), ``workers`` (each worker and its work
horses) and ``redis``; the peer's ``flower``, ``worker`` (the Celery worker, its pool's children included) and
``redis`` (broker and backend: the same server); each side's own processes face each other in the ratios.
"""

from __future__ import annotations

from typing import Any

from bench.process_cpu import TOTAL
from bench.report import Row, _check
from bench.stack import CELERY_POOL_NAMES

PAIRS = (("web", "flower"), ("workers", "worker"), ("redis", "redis"), (TOTAL, TOTAL))
SAME = (("web", "web"), ("redis", "redis"), (TOTAL, TOTAL))  # taskport beside its own baseline app
# issue 32's targets on CPU: after / before (same run) per (operation, process), and e2e against the peer
BEFORE_TARGETS = {("delivery", "workers"): 0.6, ("submit", "web"): 0.7, ("submit", "redis"): 0.8}
E2E_CPU_TARGET, COMMANDS_TARGET = 0.5, 25
OP_NAMES = {"submit": "submit (no worker running: they are stopped)", "status": "status read (a queued task)",
            "delivery": "delivery (no-op task, the stopped workers' backlog drained)"}


def cpu_of(found: dict[str, Any] | None) -> dict[str, float] | None:
    """A figure's CPU per operation: the least of its rounds where kept, else its own round's."""
    if not found:
        return None
    cpu: dict[str, float] | None = found.get("least_cpu_ms_per_op") or found.get("cpu_ms_per_op")
    return cpu


def _ms(cpu: dict[str, float]) -> str:
    return " · ".join(f"{name} {ms:.3f}" for name, ms in cpu.items() if name != TOTAL) + f" · **all {cpu[TOTAL]:.3f}**"


def before_after_rows(found: dict[str, Any]) -> list[Row]:
    """Per operation and process: this checkout's CPU beside the before commit's, from the same run."""
    commit, rows = found["before_commit"], []
    for op, name in OP_NAMES.items():
        before, after = found["before"][op]["cpu_ms_per_op"], found["after"][op]["cpu_ms_per_op"]
        for process in after:
            ratio = after[process] / before[process] if before.get(process) else 0.0
            target = BEFORE_TARGETS.get((op, process))
            label = "every process summed" if process == TOTAL else process
            rows.append(Row(f"CPU per {name}, {label}: this checkout vs {commit} (issue 32, same run)"
                            + ("" if target else " (for the record)"), f"{after[process]:.3f} ms",
                            f"{before[process]:.3f} ms", f"{ratio:.2f}×", f"≤ {target}×" if target else "",
                            _check(ratio <= target) if target else ""))
    commands = [found[side]["delivery"]["commands_per_delivery"] for side in ("after", "before")]
    rows.append(Row(f"Redis commands per delivery in the drain above (every command the server ran, scripts' inside "
                    f"included), this checkout vs {commit} (for the record)", f"{commands[0]:g}", f"{commands[1]:g}",
                    f"{commands[0] / commands[1]:.2f}×" if commands[1] else ""))
    return rows


def commands_row(delivery: dict[str, Any]) -> Row:
    """Redis commands per delivery as the in-process round-trip count measures them (bench.measure_redis)."""
    ours, bare = delivery["taskport"]["commands_total"], delivery["bare_rq"]["commands_total"]
    return Row("Redis commands per delivery (simple class, in-process, scripts' commands included) vs bare RQ",
               f"{ours:g}", f"{bare:g}", f"{ours / bare:.2f}×" if bare else "", f"≤ {COMMANDS_TARGET}",
               _check(ours <= COMMANDS_TARGET))


def peer_least(out: dict[str, Any], name: str) -> tuple[str, dict[str, float]] | None:
    """The Celery configuration with the least CPU per operation for figure ``name``, and that CPU."""
    found = [(pool, cpu) for pool, figures in out["celery"].get("pools", {}).items()
             if (cpu := cpu_of(figures.get(name))) is not None]
    return min(found, key=lambda f: f[1][TOTAL]) if found else None


def e2e_cpu_rows(out: dict[str, Any]) -> list[Row]:
    """End to end, every process summed per task: taskport vs Celery + Flower's least (issue 32: ≤ 0.5×)."""
    rows = []
    for name in ("e2e", "e2e_large"):
        ours, theirs = cpu_of(out.get(name)), peer_least(out, name)
        if ours is None or theirs is None:
            continue
        pool, cpu = theirs
        ratio = ours[TOTAL] / cpu[TOTAL] if cpu[TOTAL] else 0.0
        rows.append(Row(f"CPU per task end to end ({out[name]['tasks']:,} no-op tasks), every process summed: taskport "
                        f"vs Celery + Flower at its least ({CELERY_POOL_NAMES[pool]})", _ms(ours), _ms(cpu),
                        f"{ratio:.2f}×", f"≤ {E2E_CPU_TARGET}×", _check(ratio <= E2E_CPU_TARGET)))
    return rows


def _ratios(ours: dict[str, float], theirs: dict[str, float], pairs: tuple[tuple[str, str], ...] = PAIRS) -> str:
    """Each of our groups' CPU over the matching group's of the other side (``all``: every process summed)."""
    def name(a: str, b: str) -> str:
        a, b = ("all" if g == TOTAL else g for g in (a, b))
        return a if a == b else f"{a}/{b}"

    return ", ".join(f"{name(a, b)} {ours[a] / theirs[b]:.2f}×" for a, b in pairs if a in ours and theirs.get(b))


def headline_rows(out: dict[str, Any]) -> list[tuple[str, dict[str, float] | None, dict[str, float] | None, str]]:
    """(operation, taskport's CPU, the peer's CPU, the peer's configuration) for each operation measured."""
    http, live, celery = out.get("http", {}), out.get("live", {}), out.get("celery", {})
    after = out.get("before_after", {}).get("after", {})
    workers = out.get("workers", {}).get("simple", {}).get("taskport")
    rows: list[tuple[str, dict[str, float] | None, dict[str, float] | None, str]] = [
        ("submit, no worker running", cpu_of(http.get("submit")) or cpu_of(after.get("submit")),
         cpu_of(celery.get("submit")), "no worker"),
        ("status read, no worker running (taskport: a queued task; Flower: info of a finished one)",
         cpu_of(http.get("status")) or cpu_of(after.get("status")), cpu_of(celery.get("info")), "prefork, idle")]
    for name, label in (("submit_live", "submit, workers running (consuming)"),
                        ("status_live", "status read of a finished task, workers running (Flower: info)")):
        peer = peer_least(out, "info_live" if name == "status_live" else name)
        rows.append((label, cpu_of(live.get(name)), peer[1] if peer else None, peer[0] if peer else ""))
    rows.append(("delivery of a no-op task (workers and Redis)", cpu_of(workers) or cpu_of(after.get("delivery")),
                 cpu_of(celery.get("delivery")), "prefork"))
    for name in ("e2e", "e2e_large"):
        if name in out:
            peer = peer_least(out, name)
            rows.append((f"task end to end ({out[name]['tasks']:,} over HTTP, polled)", cpu_of(out[name]),
                         peer[1] if peer else None, peer[0] if peer else ""))
    return rows


def headline(out: dict[str, Any]) -> list[str]:
    """RESULTS.md's first table: CPU ms per operation per process, taskport beside the peer, with ratios."""
    lines = ["## CPU per operation, per process (the headline: issue 32)", "",
             "CPU ms of one core per operation from `/proc/<pid>/stat` of each process and its children, the least "
             "of the rounds (see README.md, \"What each number means\"); `all` = every process of the side summed.",
             "", "| Per | taskport: web · workers · redis | Celery + Flower: flower · worker · redis | ratios |",
             "|---|---|---|---|"]
    for label, ours, theirs, pool in headline_rows(out):
        if ours is None:
            continue
        peer = f"{_ms(theirs)} ({pool})" if theirs else "—"
        lines.append(f"| {label} | {_ms(ours)} | {peer} | {_ratios(ours, theirs) if theirs else ''} |")
    return lines + [""]


def status_cpu_row(http: dict[str, Any]) -> Row:
    """The status read's CPU beside the bare Flask one-GET app's (the throughput row's baseline), for the record."""
    ours, bare = cpu_of(http["status"]), cpu_of(http["bare_get"])
    if not ours or not bare:
        return Row("CPU per status read vs bare Flask one GET", "not measured")
    return Row("CPU per status read GET /api/v1/tasks/{id} (a queued task) vs bare Flask one GET, no worker running "
               "(for the record)", _ms(ours), _ms(bare), _ratios(ours, bare, SAME))
