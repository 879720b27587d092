"""The bench's table: every figure beside its baseline, the ratio, the issue's target and PASS/FAIL."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.core.config import Config
from bench.process_cpu import TOTAL
from bench.stack import CELERY_POOL_NAMES

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
             ("status GET /api/v1/tasks/{id}", status, bare, "bare Flask one GET (no middleware)", 0.95)]
    for name, measured, base, base_name, target in pairs:
        ratio = _ratio(measured["rps"], base["rps"])
        rows.append(Row(f"{name} throughput vs {base_name}", f"{measured['rps']:,.0f} req/s",
                        f"{base['rps']:,.0f} req/s", f"{ratio:.2f}×", f"≥ {target}×", _check(ratio >= target)))
        rows.append(Row(f"{name} latency p50 / p99", f"{measured['p50_ms']:.1f} / {measured['p99_ms']:.1f} ms",
                        f"{base['p50_ms']:.1f} / {base['p99_ms']:.1f} ms",
                        f"{_ratio(measured['p50_ms'], base['p50_ms']):.2f}× p50"))
    ratio = _ratio(status["rps"], hello["rps"])
    rows.append(Row("status GET /api/v1/tasks/{id} vs GET /bench/hello, both through taskport's app (issue 23)",
                    f"{status['rps']:,.0f} req/s", f"{hello['rps']:,.0f} req/s", f"{ratio:.2f}×",
                    f"≥ {STATUS_HELLO_TARGET}×", _check(ratio >= STATUS_HELLO_TARGET)))
    ratio = _ratio(status["rps"], get["rps"])
    rows.append(Row("status GET /api/v1/tasks/{id} vs GET /bench/get in taskport's app (1 GET; for the record)",
                    f"{status['rps']:,.0f} req/s", f"{get['rps']:,.0f} req/s", f"{ratio:.2f}×"))
    cost = 1000 / get["rps"] - 1000 / bare["rps"] if get["rps"] and bare["rps"] else 0.0
    cost_text = (f"≈ {cost * 1000 * 2:,.0f} µs of one core per request, 2 web processes" if cost > 0
                 else "the bare app was not faster in this run: the cost is below this run's noise")
    rows.append(Row("taskport's middleware: in-app one GET vs bare Flask one GET", f"{get['rps']:,.0f} req/s",
                    f"{bare['rps']:,.0f} req/s", f"{_ratio(get['rps'], bare['rps']):.2f}× ({cost_text})"))
    if "batch_submit" in http:
        rows.append(batch_submit_row(http["batch_submit"], submit, "single submit POST /api/v1/tasks", ISOLATED))
        rows += batch_status_rows(http, status, ISOLATED + ", PENDING")
    return rows


STATUS_HELLO_TARGET, STORED_TARGET = 0.8, 0.95  # issue 23: status vs hello; status with 1,000,000 stored vs 1,000


def stored_rows(stored: dict[str, Any]) -> list[Row]:
    """Status reads with a million finished tasks stored beside a thousand (bench.stored)."""
    small, large = stored["small"], stored["large"]
    ratio = _ratio(large["rps"], small["rps"])
    return [Row(f"status GET /api/v1/tasks/{{id}} with {large['stored']:,} finished tasks stored (reads over "
                f"{large['distinct_read']:,} of them) vs {small['stored']:,} stored",
                f"{large['rps']:,.0f} req/s, p99 {large['p99_ms']:.1f} ms",
                f"{small['rps']:,.0f} req/s, p99 {small['p99_ms']:.1f} ms", f"{ratio:.2f}×",
                f"≥ {STORED_TARGET}×", _check(ratio >= STORED_TARGET))]


ISOLATED, LIVE = "no worker running", "workers running"
BATCH_TARGET, BATCH_STATUS_TARGET = 10, 0.9  # issue 21: tasks/s ≥ 10× a single submit's; batch status ≥ 0.9× a task's
LIVE_SUBMIT_TARGET, LIVE_STATUS_TARGET, E2E_TARGET = 3, 1.2, 2  # issue 23, against the peer at its best


def batch_submit_row(batch: dict[str, Any], single: dict[str, Any], single_name: str, condition: str) -> Row:
    """Tasks accepted per second through batches beside a single submit's (one task a request)."""
    ratio = _ratio(batch["tasks_per_s"], single["rps"])
    return Row(f"batch submit POST /api/v1/batches ({batch['batch_size']:,} tasks a request, {batch['conns']} "
               f"connections), {condition}: tasks accepted/s vs {single_name} ({single['conns']} connections)",
               f"{batch['tasks_per_s']:,.0f} tasks/s ({batch['rps']:.1f} batches/s, p50 {batch['p50_ms']:,.0f} ms)",
               f"{single['rps']:,.0f} tasks/s", f"{ratio:.1f}×", f"≥ {BATCH_TARGET}×", _check(ratio >= BATCH_TARGET))


def batch_status_rows(found: dict[str, Any], status: dict[str, Any], condition: str, suffix: str = "") -> list[Row]:
    """A batch's status read (one HGETALL whatever its size) beside a task's, per batch size."""
    rows = []
    for size in (10, 1000):
        batch = found[f"batch_status_{size}{suffix}"]
        ratio = _ratio(batch["rps"], status["rps"])
        rows.append(Row(f"batch status GET /api/v1/batches/{{id}}, batches of {size:,} tasks, {condition}: vs status "
                        "GET /api/v1/tasks/{id}", f"{batch['rps']:,.0f} req/s, p99 {batch['p99_ms']:.1f} ms",
                        f"{status['rps']:,.0f} req/s, p99 {status['p99_ms']:.1f} ms", f"{ratio:.2f}×",
                        f"≥ {BATCH_STATUS_TARGET}×", _check(ratio >= BATCH_STATUS_TARGET)))
    return rows


def _rate(found: dict[str, Any]) -> float:
    return float(found["tasks_per_s"] if "tasks_per_s" in found else found["rps"])


PEER_FIGURES = {"e2e": "end to end", "e2e_large": "end to end (large)", "e2e_large_stored": "large, to last COMPLETED",
                "submit_live": "submit", "status_live": "result", "info_live": "info"}


def pool_rows(celery: dict[str, Any]) -> list[Row]:
    """Both Celery worker configurations, each figure of each (issue 23: both rows printed)."""
    rows = []
    for pool, found in celery["pools"].items():
        peer_in = [label for name, label in PEER_FIGURES.items() if celery[name]["pool"] == pool]
        e2e, large = found["e2e"], found["e2e_large"]
        rows.append(Row(f"Celery + Flower, worker {CELERY_POOL_NAMES[pool]}, -E (for the record; the faster "
                        "configuration is the peer of each ratio)",
                        f"end to end {e2e['tasks_per_s']:,.0f} tasks/s ({e2e['tasks']:,}), "
                        f"{large['tasks_per_s']:,.0f} ({large['tasks']:,}; to the last COMPLETED "
                        f"{found['e2e_large_stored']['tasks_per_s']:,.0f})",
                        f"{LIVE}: submit {found['submit_live']['rps']:,.0f}, result "
                        f"{found['status_live']['rps']:,.0f}, info {found['info_live']['rps']:,.0f} req/s",
                        "the peer for: " + (", ".join(peer_in) or "none")))
    return rows


def _vs(name: str, ours: dict[str, Any], theirs: dict[str, Any], target: float | None = None,
        detail: str = "") -> Row:
    ratio = _ratio(_rate(ours), _rate(theirs))
    pool = f" ({theirs['pool']})" if "pool" in theirs else ""
    unit = "tasks/s" if "tasks_per_s" in ours else "req/s"
    return Row(name if target else f"{name} (for the record)", f"{_rate(ours):,.0f} {unit}",
               f"{_rate(theirs):,.0f} {'tasks/s' if 'tasks_per_s' in theirs else 'req/s'}{pool}",
               f"{ratio:.2f}×" + (f" ({detail})" if detail else ""), f"≥ {target}×" if target else "",
               _check(ratio >= target) if target else "")


def isolated_peer_rows(http: dict[str, Any], celery: dict[str, Any]) -> list[Row]:
    """taskport's isolated rows (no worker running) beside Flower's, for the record; the batch submit's target."""
    batch = http.get("batch_submit")
    rows = [_vs("submit: POST /api/v1/tasks vs Flower POST /api/task/async-apply, no worker running", http["submit"],
                celery["submit"]),
            _vs("status: GET /api/v1/tasks/{id} vs Flower GET /api/task/result/{id}, isolated", http["status"],
                celery["status"]),
            _vs("status: GET /api/v1/tasks/{id} vs Flower GET /api/task/info/{id} (its memory), isolated",
                http["status"], celery["info"])]
    if batch:
        rows.append(_vs(f"batch submit ({batch['batch_size']:,} tasks a request), {ISOLATED}: tasks accepted/s vs "
                        "Flower async-apply (one task a request; Flower has no batch endpoint)", batch,
                        celery["submit"], BATCH_TARGET))
    return rows


def live_rows(http: dict[str, Any] | None, celery: dict[str, Any], live: dict[str, Any]) -> list[Row]:
    """Submit, status and the batch rows with the workers running (taskport's and Celery's consuming)."""
    sub, st = live["submit_live"], live["status_live"]

    def moved(name: str, peer: str) -> str:
        if http is None:
            return ""
        return (f"{ISOLATED}: taskport {http[name]['rps']:,.0f}, Flower {celery[peer]['rps']:,.0f} req/s; "
                f"live/isolated {_ratio(live[name + '_live']['rps'], http[name]['rps']):.2f}× and "
                f"{_ratio(celery[peer + '_live']['rps'], celery[peer]['rps']):.2f}×")

    rows = [_vs(f"submit POST /api/v1/tasks vs Flower async-apply, {LIVE} (consuming)", sub, celery["submit_live"],
                LIVE_SUBMIT_TARGET, moved("submit", "submit")),
            _vs(f"status GET /api/v1/tasks/{{id}} of finished tasks vs Flower GET /api/task/info/{{id}}, {LIVE}", st,
                celery["info_live"], LIVE_STATUS_TARGET, moved("status", "info")),
            _vs(f"status GET /api/v1/tasks/{{id}} vs Flower GET /api/task/result/{{id}}, {LIVE}", st,
                celery["status_live"]),
            batch_submit_row(live["batch_submit_live"], sub, "single submit, same", LIVE)]
    rows.append(_vs(f"batch submit ({live['batch_submit_live']['batch_size']:,} tasks a request), {LIVE}: tasks "
                    "accepted/s vs Flower async-apply", live["batch_submit_live"], celery["submit_live"], BATCH_TARGET))
    return rows + batch_status_rows(live, st, LIVE + ", DONE", "_live")


def _e2e_detail(r: dict[str, Any]) -> str:
    rounds = r.get("rounds", [])
    best = f"; best of {', '.join(f'{x:,.0f}' for x in rounds)}" if len(rounds) > 1 else ""
    pool = f", {r['pool']}" if "pool" in r else ""
    return (f"{r['tasks_per_s']:,.0f} tasks/s ({r['done']:,} of {r['tasks']:,} in {r['seconds']:.1f} s"
            f"{', TIMED OUT' if r['timed_out'] else ''}{pool}{best})")


def e2e_row(name: str, ours: dict[str, Any], theirs: dict[str, Any], target: float | None) -> Row:
    ratio = _ratio(ours["tasks_per_s"], theirs["tasks_per_s"])
    ok = ratio >= (target or 0) and not ours["timed_out"] and ours["done"] == ours["tasks"]
    return Row(name if target else f"{name} (for the record)", _e2e_detail(ours), _e2e_detail(theirs),
               f"{ratio:.2f}×", f"≥ {target}×" if target else "", _check(ok) if target else "")


def peer_rows(http: dict[str, Any] | None, celery: dict[str, Any], out: dict[str, Any]) -> list[Row]:
    """taskport beside Celery 5 + Flower 2 (REST API) at its best: both worker configurations, the isolated rows,
    the live rows and the end-to-end runs."""
    rows = pool_rows(celery)
    if http is not None:
        rows += isolated_peer_rows(http, celery)
    rows += live_rows(http, celery, out["live"])
    e2e, large, batch = out["e2e"], out["e2e_large"], out["batch_e2e"]
    who = f"taskport ({e2e['workers']} {e2e['worker_class']} workers) vs Celery + Flower at its best"
    rows.append(e2e_row(f"end to end: {e2e['tasks']:,} no-op tasks over HTTP from {e2e['conns']} clients, polled until "
                        f"done, {who}", e2e, celery["e2e"], E2E_TARGET))
    rows.append(e2e_row(f"end to end: {large['tasks']:,} no-op tasks, the same way, {who}", large, celery["e2e_large"],
                        E2E_TARGET))
    rows.append(e2e_row(f"end to end: {batch['tasks']:,} no-op tasks as {batch['tasks'] // batch['batch']:,} batches "
                        f"from {batch['conns']} clients, to the last task COMPLETED (batch documents' completed_at), "
                        f"{who} (one async-apply a task, {celery['e2e_large_stored']['conns']} clients, to the last "
                        "date_done in its backend)", batch, celery["e2e_large_stored"], None))
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
    per_task, n = memory["bytes_per_task"], memory["tasks"]
    return [Row(f"Redis memory per finished small task, as held until its result expires (all keys; growth over a "
                f"second {n:,} tasks)", f"{per_task:,.0f} B", target=f"≤ {KIB} B", verdict=_check(per_task <= KIB)),
            Row(f"Redis memory per finished task over the first {n:,} (for the record: with what a first round pays "
                "once, RQ's bounded window of finished jobs for rq-dashboard and Redis's tables' first sizes)",
                f"{memory['first_round_bytes_per_task']:,.0f} B"),
            Row("a dedup key, for its window only (300 s by default; MEMORY USAGE, before it lapses)",
                f"{memory['dedup_key_bytes']:,.0f} B")]


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


E2E_CELLS: list[tuple[str, Any]] = [
    ("tasks/s", lambda r: f"{r['tasks_per_s']:,.0f}"),
    ("all done after", lambda r: f"{r['seconds']:.1f} s"),
    ("submits done after", lambda r: f"{r['submit_seconds']:.1f} s"),
    ("status polls", lambda r: f"{r['polls']:,}"),
    ("clients", lambda r: f"{r['conns']}"),
    ("rounds (tasks/s)", lambda r: ", ".join(f"{x:,.0f}" for x in r.get("rounds", []))),
    ("CPU ms per task, per process (least of the rounds)", lambda r: _cpu_cell(r)),
]


def _cpu_cell(run: dict[str, Any]) -> str:
    cpu = run.get("least_cpu_ms_per_op") or run.get("cpu_ms_per_op")
    if not cpu:
        return "—"
    return ", ".join(f"{'all' if name == TOTAL else name} {ms:.3f}" for name, ms in cpu.items())


def _e2e_table(title: str, columns: list[str], runs: list[dict[str, Any]]) -> list[str]:
    lines = [f"## {title}", "", "| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in runs) + " |" for label, cell in E2E_CELLS]
    return lines + [""]


def e2e_tables(out: dict[str, Any]) -> list[str]:
    """RESULTS.md's end-to-end tables: taskport beside each Celery worker configuration."""
    pools = out["celery"]["pools"]
    celery = [f"Celery {CELERY_POOL_NAMES[p]}" for p in pools]
    parts = []
    for name in ("e2e", "e2e_large"):
        ours = out[name]
        parts += _e2e_table(f"End to end ({ours['tasks']:,} no-op tasks over HTTP, one submit a task, polled until "
                            "done)", [f"taskport, {ours['workers']} × {ours['worker_class']}", *celery],
                            [ours, *(pools[p][name] for p in pools)])
    batch = out["batch_e2e"]
    parts += _e2e_table(f"End to end ({batch['tasks']:,} no-op tasks, all done = the last task COMPLETED as the server "
                        "recorded it)", [f"taskport, batches of {batch['batch']:,}",
                                         *(f"{c}, one async-apply a task" for c in celery)],
                        [batch, *(pools[p]["e2e_large_stored"] for p in pools)])
    return parts


def results_markdown(meta: dict[str, Any], table_text: str, out: dict[str, Any], headline: list[str]) -> str:
    """bench/RESULTS.md: the committed copy of a run's figures, ``headline`` (bench.cpu_report's) first."""
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
    parts += [*headline, "## Every figure", "", table_text, ""]
    if "e2e" in out:
        parts += e2e_tables(out)
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
