"""bench/scale.py's arithmetic and tables: the bound one Redis primary sets, from the measured costs.

Per task = one submit + one delivery (start, progress, complete, RQ's own) + ``STATUS_READS`` status
reads. The primary carries ``1 s / (its CPU seconds per task)`` tasks/s at one full core: Redis runs
commands on one thread, so one core is its ceiling whatever the machine. The worker hosts that feeds
are counted at the measured worker-host CPU per delivery on hosts of ``HOST_CORES`` cores (this
machine's size); a 100 ms task costs the same CPU per task, it only needs more processes in flight.
"""

from __future__ import annotations

import math
from typing import Any

STATUS_READS = 1  # status reads counted per task in the bound (a client that polls once, or watches)
HOST_CORES = 2  # cores of a worker or web host in the arithmetic (this machine's)


def _us(row: dict[str, Any], what: str) -> float:
    return float(row[f"{what}_cpu_us"])


def box_cpu_ms(row: dict[str, Any]) -> dict[str, float]:
    """An end-to-end row's CPU per task on the bed (everything but other sessions' work), and the client's."""
    c = row["cores"]
    done = max(int(row["done"]), 1)
    return {"bed": round((c["machine"] - c["not_bed"]) * c["window_s"] / done * 1e3, 2),
            "client": round(c["client"] * c["window_s"] / done * 1e3, 2)}


def bound(out: dict[str, Any]) -> dict[str, Any]:
    """Tasks/s one primary carries at one core, the worker and web hosts that feeds, and this box's ceiling."""
    att = out["attribution"]
    submit, delivery = att["submit_paused"]["per_request"], att["delivery"]["per_task"]
    status = out["one_web"]["status"]["per_request"]
    redis_us = _us(submit, "redis") + _us(delivery, "redis") + STATUS_READS * _us(status, "redis")
    redis_us_no_read = _us(submit, "redis") + _us(delivery, "redis")
    commands = submit["commands"] + delivery["commands"] + STATUS_READS * status["commands"]
    per_primary = 1e6 / redis_us
    worker_host = HOST_CORES * 1e6 / max(_us(delivery, "worker"), 1.0)  # no-op tasks/s of one worker host
    web_us = _us(submit, "web") + STATUS_READS * _us(status, "web")
    per_100ms = float(out["task_100ms"]["per_worker_process"])
    best = max(out["sweep"], key=lambda r: r["tasks_per_s"])
    box = box_cpu_ms(best)
    return {
        "box_best_layout": best["layout"], "box_tasks_per_s": best["tasks_per_s"], "box_cpu_ms_per_task": box["bed"],
        "box_client_cpu_ms_per_task": box["client"], "box_ceiling_tasks_per_s": round(HOST_CORES * 1e3 / box["bed"]),
        "box_primary_cores": best["cores"]["redis_primary"],
        "status_reads_per_task": STATUS_READS, "host_cores": HOST_CORES,
        "redis_cpu_us_per_task": round(redis_us, 1), "commands_per_task": round(commands, 1),
        "tasks_per_s_one_primary_core": round(per_primary), "tasks_per_s_one_primary_core_no_status_read":
            round(1e6 / redis_us_no_read),
        "worker_host_noop_tasks_per_s": round(worker_host), "worker_hosts_fed": round(per_primary / worker_host, 1),
        "task_100ms_per_process": per_100ms, "processes_fed_100ms": math.ceil(per_primary / per_100ms),
        "processes_per_worker_host_100ms": math.ceil(worker_host / per_100ms),
        "web_cpu_us_per_task": round(web_us, 1), "web_hosts_fed": round(per_primary * web_us / 1e6 / HOST_CORES, 1),
    }


def _cores(row: dict[str, Any]) -> str:
    c = row["cores"]
    return (f"{c['machine']:.2f} | {c['redis_primary']:.2f} | {c['web']:.2f} | {c['workers']:.2f} | "
            f"{c['client']:.2f} | {c['replicas_sentinels'] + c['not_bed']:.2f}")


def _top(by_command: dict[str, float], n: int = 6) -> str:
    top = sorted(by_command.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {count:g}" for name, count in top)


def sweep_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| Layout | tasks/s (best; rounds) | per worker process | cores busy: machine | primary | web | workers "
             "| client | other | bed CPU/task | commands/task | primary CPU/task |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        each = ", ".join(f"{x:,.0f}" for x in r.get("rounds", [r["tasks_per_s"]]))
        lines.append(f"| {r['layout']} | {r['tasks_per_s']:,.0f} ({each}) | {r['per_worker_process']:,.0f} | "
                     f"{_cores(r)} | {box_cpu_ms(r)['bed']:.2f} ms | {r['per_task']['commands']:.1f} | "
                     f"{r['per_task']['redis_cpu_us']:.0f} µs |")
    return lines


def http_table(out: dict[str, Any]) -> list[str]:
    lines = ["| Web hosts | submit req/s | submit p50 / p99 | status req/s | status p50 / p99 | cores busy at submit: "
             "machine / primary / web / workers |", "|---|---|---|---|---|---|"]
    for key in ("one_web", "two_web"):
        sub, st = out[key]["submit"], out[key]["status"]
        c = sub["cores"]
        lines.append(f"| {sub['layout']} | {sub['rps']:,.0f} | {sub['p50_ms']:.1f} / {sub['p99_ms']:.1f} ms | "
                     f"{st['rps']:,.0f} | {st['p50_ms']:.1f} / {st['p99_ms']:.1f} ms | "
                     f"{c['machine']:.2f} / {c['redis_primary']:.2f} / {c['web']:.2f} / {c['workers']:.2f} |")
    return lines


def cost_table(out: dict[str, Any]) -> list[str]:
    att = out["attribution"]
    rows = [("submit (workers stopped)", att["submit_paused"]["per_request"]),
            ("delivery (start, progress, complete, RQ)", att["delivery"]["per_task"]),
            ("status read", out["one_web"]["status"]["per_request"])]
    lines = ["| Per | commands | primary CPU | web CPU | worker-host CPU | most frequent commands |",
             "|---|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} ({r['ops']:,}) | {r['commands']:.1f} | {r['redis_cpu_us']:.0f} µs | "
                     f"{r['web_cpu_us']:.0f} µs | {r['worker_cpu_us']:.0f} µs | {_top(r['by_command'])} |")
    return lines


def ack_table(ack: dict[str, Any]) -> list[str]:
    lines = ["| TASKPORT_REPLICA_ACK | submit req/s, 16 conns (best; rounds) | p50 / p99 (best round) | WAIT per "
             "request | 1 connection: req/s, p50 / p99 | end to end tasks/s (best; rounds) |",
             "|---|---|---|---|---|---|"]
    for mode in ("off", "on"):
        sub, one, e2e = ack[mode]["submit"], ack[mode]["single"], ack[mode]["e2e"]
        waits = sub["per_request"]["by_command"].get("wait", 0.0)
        lines.append(f"| {mode} | {sub['rps']:,.0f} ({', '.join(f'{x:,.0f}' for x in sub['rounds'])}) | "
                     f"{sub['p50_ms']:.1f} / {sub['p99_ms']:.1f} ms | {waits:g} | "
                     f"{one['rps']:,.0f}, {one['p50_ms']:.2f} / {one['p99_ms']:.2f} ms | "
                     f"{e2e['tasks_per_s']:,.0f} ({', '.join(f'{x:,.0f}' for x in e2e['rounds'])}) |")
    on, off = ack["on"], ack["off"]
    rps = on["submit"]["rps"] / off["submit"]["rps"]
    p50 = on["single"]["p50_ms"] / off["single"]["p50_ms"]
    added = on["single"]["p50_ms"] - off["single"]["p50_ms"]
    e2e_ratio = on["e2e"]["tasks_per_s"] / off["e2e"]["tasks_per_s"]
    lines.append(f"\nReplica ack on / off ({ack['layout']}): submit req/s {rps:.2f}×, single-connection p50 "
                 f"{p50:.2f}× ({added:+.2f} ms), end to end {e2e_ratio:.2f}×.")
    return lines


def bound_lines(b: dict[str, Any], out: dict[str, Any]) -> list[str]:
    drain = out["attribution"]["delivery"]
    t100 = out["task_100ms"]
    return [
        f"- this box: best {b['box_tasks_per_s']:,.0f} tasks/s ({b['box_best_layout']}) at "
        f"{b['box_cpu_ms_per_task']:.2f} ms of bed CPU per task ({b['box_client_cpu_ms_per_task']:.2f} of it the "
        f"client's): its {b['host_cores']} cores carry at most {b['box_ceiling_tasks_per_s']:,} tasks/s; "
        f"the primary used {b['box_primary_cores']:.2f} of a core",
        f"- per task ({b['status_reads_per_task']} status read): {b['commands_per_task']:.1f} commands, "
        f"{b['redis_cpu_us_per_task']:.0f} µs of the primary's CPU",
        f"- one primary at one full core: **{b['tasks_per_s_one_primary_core']:,} tasks/s** "
        f"({b['tasks_per_s_one_primary_core_no_status_read']:,} with no status read)",
        f"- delivery drain: {drain['tasks_per_s']:,.0f} tasks/s, {drain['per_worker_process']:,.0f} per worker "
        f"process; a {b['host_cores']}-core worker host carries {b['worker_host_noop_tasks_per_s']:,} no-op "
        f"tasks/s at its CPU per delivery, so one primary feeds **{b['worker_hosts_fed']:g} such worker host(s)**",
        f"- 100 ms tasks: {t100['per_worker_process']:.1f} tasks/s per worker process ({t100['workers']} processes, "
        f"{t100['tasks_per_s']:.0f} tasks/s): {b['processes_fed_100ms']:,} processes to feed one primary, "
        f"~{b['processes_per_worker_host_100ms']:,} per {b['host_cores']}-core host before its CPU is the limit",
        f"- web CPU per task (submit + read): {b['web_cpu_us_per_task']:.0f} µs: "
        f"{b['web_hosts_fed']:g} {b['host_cores']}-core web host(s) at the primary's bound",
    ]


def markdown(meta: dict[str, Any], out: dict[str, Any]) -> str:
    head = (f"bench/scale.py{' --quick' if meta['quick'] else ''} on {meta['date']}, commit {meta['commit']}, "
            f"{meta['cpus']} CPUs, load average at start {meta['loadavg_start'][0]:.2f}; {meta['seconds']} s; "
            f"processes outside the bed used {meta['not_bed_share']:.0%} of the machine during the windows")
    parts = [head, "", "### End to end (no-op tasks over HTTP, 16 connections)", "", *sweep_table(out["sweep"]), "",
             "### Submit and status req/s, workers running", "", *http_table(out), "",
             "### Cost per operation (less the idle background)", "", *cost_table(out), "",
             "### The bound", "", *bound_lines(out["bound"], out), "",
             "### TASKPORT_REPLICA_ACK", "", *ack_table(out["replica_ack"])]
    return "\n".join(parts)
