"""The bench's table: every figure beside its baseline, the ratio, the issue's target and PASS/FAIL."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.core.config import Config

KIB = 1024
DEFAULT_CLASS = Config().worker_class  # the worker class `taskport up` runs: its rows carry the verdicts


@dataclass
class Row:
    measure: str
    value: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    verdict: str = ""  # PASS, FAIL, or "" (for the record)

    def cells(self) -> list[str]:
        return [self.measure, self.value, self.baseline, self.ratio, self.target, self.verdict]


def _check(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else 0.0


def http_rows(http: dict[str, Any], ceiling: dict[str, Any]) -> list[Row]:
    hello, submit, get, status = http["hello"], http["submit"], http["get"], http["status"]
    rows = [Row("load generator ceiling (canned server) vs gunicorn hello", f"{ceiling['rps']:,.0f} req/s",
                f"{hello['rps']:,.0f} req/s", f"{_ratio(ceiling['rps'], hello['rps']):.1f}×",
                "≫ 1× (not the bottleneck)", _check(ceiling["rps"] >= 3 * hello["rps"]))]
    bare = http.get("bare_get", get)
    pairs = [("submit POST /api/v1/tasks", submit, hello, "GET /bench/hello", 0.5),
             ("status GET /api/v1/tasks/{id}", status, bare, "bare Flask one GET (no middleware)", 0.9)]
    for name, measured, base, base_name, target in pairs:
        ratio = _ratio(measured["rps"], base["rps"])
        rows.append(Row(f"{name} throughput vs {base_name}", f"{measured['rps']:,.0f} req/s",
                        f"{base['rps']:,.0f} req/s", f"{ratio:.2f}×", f"≥ {target}×", _check(ratio >= target)))
        rows.append(Row(f"{name} latency p50 / p99", f"{measured['p50_ms']:.1f} / {measured['p99_ms']:.1f} ms",
                        f"{base['p50_ms']:.1f} / {base['p99_ms']:.1f} ms",
                        f"{_ratio(measured['p50_ms'], base['p50_ms']):.2f}× p50"))
    ratio = _ratio(status["rps"], get["rps"])
    rows.append(Row("status GET /api/v1/tasks/{id} vs GET /bench/get in taskport's app (1 GET; for the record)",
                    f"{status['rps']:,.0f} req/s", f"{get['rps']:,.0f} req/s", f"{ratio:.2f}×"))
    cost = 1000 / get["rps"] - 1000 / bare["rps"] if get["rps"] and bare["rps"] else 0.0
    cost_text = (f"≈ {cost * 1000 * 2:,.0f} µs of one core per request, 2 web processes" if cost > 0
                 else "the bare app was not faster in this run: the cost is below this run's noise")
    rows.append(Row("taskport's middleware: in-app one GET vs bare Flask one GET", f"{get['rps']:,.0f} req/s",
                    f"{bare['rps']:,.0f} req/s", f"{_ratio(get['rps'], bare['rps']):.2f}× ({cost_text})"))
    return rows


def peer_rows(http: dict[str, Any] | None, peer: dict[str, Any], e2e: dict[str, Any]) -> list[Row]:
    """taskport beside Celery 5 + Flower 2 (REST API): submit, status, end to end."""
    rows = []
    fsub, fstat, fe2e = peer["submit"], peer["status"], peer["e2e"]
    if http is not None:
        for name, ours, theirs in (
            ("submit: POST /api/v1/tasks vs Flower POST /api/task/async-apply", http["submit"], fsub),
            ("status: GET /api/v1/tasks/{id} vs Flower GET /api/task/result/{id}", http["status"], fstat),
        ):
            rows.append(Row(f"{name} (for the record)", f"{ours['rps']:,.0f} req/s", f"{theirs['rps']:,.0f} req/s",
                            f"{_ratio(ours['rps'], theirs['rps']):.2f}×"))
    ratio = _ratio(e2e["tasks_per_s"], fe2e["tasks_per_s"])
    ok = ratio >= 1.5 and not e2e["timed_out"] and e2e["done"] == e2e["tasks"]

    def detail(r: dict[str, Any]) -> str:
        rounds = r.get("rounds", [])
        best = f"; best of {', '.join(f'{x:,.0f}' for x in rounds)}" if len(rounds) > 1 else ""
        return (f"{r['tasks_per_s']:,.0f} tasks/s ({r['done']:,} of {r['tasks']:,} in {r['seconds']:.1f} s"
                f"{', TIMED OUT' if r['timed_out'] else ''}{best})")

    rows.append(Row(f"end to end: {e2e['tasks']:,} no-op tasks over HTTP from 16 clients, polled until done, "
                    f"taskport ({e2e['workers']} {e2e['worker_class']} workers) vs Celery + Flower",
                    detail(e2e), detail(fe2e), f"{ratio:.2f}×", "≥ 1.5×", _check(ok)))
    return rows


def e2e_worker_rows(by_workers: dict[str, Any], celery: dict[str, Any]) -> list[Row]:
    """``--e2e-workers``: taskport's end to end per worker count beside the Celery run (for the record)."""
    rows = []
    for n, r in by_workers.items():
        rounds = ", ".join(f"{x:,.0f}" for x in r["rounds"])
        rows.append(Row(f"end to end, taskport with {n} {r['worker_class']} workers vs Celery + Flower "
                        f"(for the record; rounds: {rounds})", f"{r['tasks_per_s']:,.0f} tasks/s",
                        f"{celery['tasks_per_s']:,.0f} tasks/s",
                        f"{_ratio(r['tasks_per_s'], celery['tasks_per_s']):.2f}×"))
    return rows


def watcher_rows(found: dict[str, Any]) -> list[Row]:
    """Serving model (gevent vs gthread, no watcher), then polls and event delays per watcher count."""
    gevent = found["gevent"]
    counts = list(gevent)
    gthread = found["gthread"][counts[0]]["polls"]
    base = gevent[counts[0]]["polls"]
    ratio = _ratio(base["rps"], gthread["rps"])
    rows = [Row(f"status polls, no watcher: gevent worker vs gthread (2 × {found.get('threads', 8)} threads)",
                f"{base['rps']:,.0f} req/s, p99 {base['p99_ms']:.1f} ms",
                f"{gthread['rps']:,.0f} req/s, p99 {gthread['p99_ms']:.1f} ms", f"{ratio:.2f}×",
                "≥ 1.0× (not slower)", _check(ratio >= 1.0)),
            Row("web CPU per status poll, no watcher: gevent vs gthread (not skewed by a busy machine)",
                f"{base['web_cpu_ms_per_poll']:.3f} ms", f"{gthread['web_cpu_ms_per_poll']:.3f} ms",
                f"{_ratio(base['web_cpu_ms_per_poll'], gthread['web_cpu_ms_per_poll']):.2f}×")]
    for n in counts[1:]:
        entry = gevent[n]
        polls, stream = entry["polls"], entry["stream"]
        ratio = _ratio(polls["rps"], base["rps"])
        rows.append(Row(f"status polls beside {int(n):,} live watchers (gevent) vs {int(counts[0]):,} watchers",
                        f"{polls['rps']:,.0f} req/s", f"{base['rps']:,.0f} req/s", f"{ratio:.2f}×", "≥ 0.8×",
                        _check(ratio >= 0.8)))
        rows.append(Row(f"web CPU per status poll beside {int(n):,} live watchers (streams' work included)",
                        f"{polls['web_cpu_ms_per_poll']:.3f} ms", f"{base['web_cpu_ms_per_poll']:.3f} ms",
                        f"{_ratio(polls['web_cpu_ms_per_poll'], base['web_cpu_ms_per_poll']):.2f}×"))
        rows.append(Row(f"status polls beside {int(n):,} live watchers, p50 / p99",
                        f"{polls['p50_ms']:.1f} / {polls['p99_ms']:.1f} ms",
                        f"{base['p50_ms']:.1f} / {base['p99_ms']:.1f} ms", target="p99 < 100 ms",
                        verdict=_check(polls["p99_ms"] < 100)))
        ok = stream["delay_p99_ms"] < 1000 and stream["missed"] == 0 and stream["late_over_1s"] == 0 \
            and not stream["refused"]
        rows.append(Row(f"event delay, {int(n):,} watchers × {entry['changes']:,} changes: p50 / p99 / max",
                        f"{stream['delay_p50_ms']:.0f} / {stream['delay_p99_ms']:.0f} / "
                        f"{stream['delay_max_ms']:.0f} ms",
                        ratio=f"{stream['events']:,} events, {stream['missed']} missed, {stream['late_over_1s']} over "
                              f"1 s, {sum(stream['refused'].values())} refused; watcher process "
                              f"{stream['cpu_share']:.0%} CPU",
                        target="each change within 1 s", verdict=_check(ok)))
    return rows


def worker_rows(workers: dict[str, Any]) -> list[Row]:
    rows = []
    for cls, found in workers.items():
        ours, bare = found["taskport"], found["bare_rq"]
        ratio = _ratio(ours["jobs_per_s"], bare["jobs_per_s"])
        default = cls == DEFAULT_CLASS
        label = f"worker throughput, {cls} ({found['processes']} processes), no-op task vs bare RQ no-op"
        rows.append(Row(label if default else label + " (for the record)", f"{ours['jobs_per_s']:,.0f} jobs/s",
                        f"{bare['jobs_per_s']:,.0f} jobs/s", f"{ratio:.2f}×", "≥ 1.0×",
                        _check(ratio >= 1.0) if default else f"({_check(ratio >= 1.0)})"))
    for cls, found in workers.items():
        lat = found["latency"]
        default = cls == DEFAULT_CLASS
        rows.append(Row(f"submit → COMPLETED, idle {cls} worker, p50 / p99" + ("" if default else " (for the record)"),
                        f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} ms", target="p50 ≤ 15 ms",
                        verdict=_check(lat["p50_ms"] <= 15) if default else f"({_check(lat['p50_ms'] <= 15)})"))
    return rows


def trips_rows(trips: dict[str, Any], delivery: dict[str, Any]) -> list[Row]:
    sub, st, ex = trips["submit"], trips["status"], trips["execution"]
    ours, bare = delivery["taskport"], delivery["bare_rq"]
    return [
        Row("Redis round trips per submit", f"{sub['round_trips']:g}", ratio=f"{sub['commands_total']:g} commands",
            target="≤ 3", verdict=_check(sub["round_trips"] <= 3)),
        Row("Redis round trips per status read", f"{st['round_trips']:g}", ratio=f"{st['commands_total']:g} commands",
            target="= 1", verdict=_check(st["round_trips"] == 1)),
        Row("Redis round trips per execution (Runner.run, no-op)", f"{ex['round_trips']:g}",
            ratio=f"{ex['commands_total']:g} commands"),
        Row("Redis round trips per RQ delivery (simple class, whole) vs bare RQ SimpleWorker",
            f"{ours['round_trips']:g}",
            f"{bare['round_trips']:g}", f"{ours['commands_total']:g} vs {bare['commands_total']:g} commands"),
    ]


def envelope_rows(envelope: dict[str, Any]) -> list[Row]:
    fast, schema = envelope["fast_path_us"], envelope["schema_load_us"]
    return [Row("submit envelope, typical body: derived fast path vs SubmitSchema.load (for the record)",
                f"{fast:.2f} µs", f"{schema:.2f} µs", f"{_ratio(fast, schema):.2f}×")]


def memory_rows(memory: dict[str, Any]) -> list[Row]:
    per_task = memory["bytes_per_task"]
    return [Row(f"Redis memory per finished small task ({memory['tasks']:,} tasks, all keys)",
                f"{per_task:,.0f} B", target=f"≤ {KIB} B", verdict=_check(per_task <= KIB))]


def checkpoint_rows(checkpoint: dict[str, int]) -> list[Row]:
    return [Row(f"checkpoint log per 10,000 items done ({case})", f"{size:,} B") for case, size in checkpoint.items()]


def housekeeping_rows(housekeeping: dict[str, Any]) -> list[Row]:
    fin, unfin = housekeeping["finished"], housekeeping["unfinished"]
    live = f"{housekeeping['live_tasks']:,}"
    return [
        Row(f"housekeeping expiry pass: {fin['touched']:,} finished due among {live}",
            f"{fin['seconds'] * 1000:,.0f} ms", target="< 1 s", verdict=_check(fin["seconds"] < 1)),
        Row(f"housekeeping expiry pass: {unfin['touched']:,} unfinished (queued) due (for the record)",
            f"{unfin['seconds'] * 1000:,.0f} ms", target="< 1 s", verdict=f"({_check(unfin['seconds'] < 1)})"),
    ]


def markdown(rows: list[Row]) -> str:
    head = ["Measure", "taskport", "Baseline", "Ratio / detail", "Target", "Result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def rows_json(rows: list[Row]) -> list[dict[str, str]]:
    return [asdict(r) for r in rows]


def worker_class_table(workers: dict[str, Any]) -> str:
    lines = ["| Class | taskport jobs/s | bare RQ jobs/s | ratio | submit → COMPLETED p50 / p99 |",
             "|---|---|---|---|---|"]
    for cls, found in workers.items():
        ours, bare, lat = found["taskport"], found["bare_rq"], found["latency"]
        ratio = _ratio(ours["jobs_per_s"], bare["jobs_per_s"])
        lines.append(f"| {cls} | {ours['jobs_per_s']:,.0f} | {bare['jobs_per_s']:,.0f} | {ratio:.2f}× | "
                     f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} ms |")
    return "\n".join(lines)


# The figures measured by hand-run benches of their own, which --record does not rewrite
SEE_ALSO = ["Scale-out across hosts (the multi-host bed, `make bench-scale`): [SCALE.md](SCALE.md).",
            "Tasks that wait (`run_at`, `after`) and schedules: lateness and Redis bytes in "
            "[SCHEDULING.md](SCHEDULING.md).", ""]


def results_markdown(meta: dict[str, Any], table_text: str, out: dict[str, Any]) -> str:
    """bench/RESULTS.md: the committed copy of a run's figures."""
    cpu = meta.get("cpu", {})
    parts = [
        "# Latest benchmark figures", "",
        f"`make bench` on {meta['date']}, commit {meta['commit']}, Python {meta['python']}, {meta['cpus']} CPUs; "
        f"gunicorn {meta['gunicorn_workers']} workers × {meta['gunicorn_threads']} threads, {meta['rq_workers']} RQ "
        f"workers, {meta['conns']} connections, {meta['duration_s']:g} s windows; {meta['total_seconds']} s in all. "
        f"Other processes used {cpu.get('other_share_of_machine', 0):.0%} of the machine during the run "
        "(see [README.md](README.md#what-each-number-means)). "
        "Regenerate with `.venv/bin/python bench/run.py --record`.", "",
    ]
    if cpu.get("other_share_of_machine", 0) > 0.1:
        parts += ["**This run shared the 2-core machine with other sessions' tests and benchmarks** (the share "
                  "above): absolute figures are low and noisy; the ratios, each taken within this one run with "
                  "the best of alternating rounds, are what count.", ""]
    parts += [table_text, ""]
    if "e2e" in out:
        ours, theirs = out["e2e"], out["celery"]["e2e"]
        parts += ["## End to end (2,000 no-op tasks over HTTP, 16 clients, polled until done)", "",
                  "| | taskport | Celery + Flower |", "|---|---|---|",
                  f"| tasks/s | {ours['tasks_per_s']:,.0f} | {theirs['tasks_per_s']:,.0f} |",
                  f"| all done in | {ours['seconds']:.1f} s | {theirs['seconds']:.1f} s |",
                  f"| submits done after | {ours['submit_seconds']:.1f} s | {theirs['submit_seconds']:.1f} s |",
                  f"| status polls | {ours['polls']:,} | {theirs['polls']:,} |",
                  f"| workers | {ours['workers']} × {ours['worker_class']} | Celery prefork, 2 children |", ""]
    if "workers" in out:
        parts += ["## Worker classes (2 processes, no-op tasks)", "", worker_class_table(out["workers"]), ""]
    if "memory" in out:
        breakdown = out["memory"]["breakdown_bytes_per_task"]
        parts += ["## Redis memory per finished task, by kind of key (MEMORY USAGE, bytes per task)", "",
                  "| Key | bytes/task |", "|---|---|"]
        parts += [f"| `{kind}` | {size:,.1f} |" for kind, size in breakdown.items() if size >= 0.5]
        parts += [""]
    parts += SEE_ALSO
    return "\n".join(parts)
