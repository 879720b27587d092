"""Scale-out on the multi-host bed (issue 19, part 7, and the replica-ack cost of part 3).

    .venv/bin/python bench/scale.py [--quick] [--keep] [--output FILE]      # as root: the bed makes namespaces

Builds tests/scale's bed (a Redis primary, two replicas, three Sentinels, app hosts, a client host, each a
network namespace) and, per configuration, starts the Procfile's processes on the app hosts pointed at
the Sentinels (tests/scale/cluster.py), measures from the client host (bench/scale_client.py), stops them
and flushes the primary:

1. end-to-end no-op tasks/s (bench/e2e.py's method) with 1, 2, 4 worker processes on one worker host and
   2, 4 across two, one web host; then the best of those worker layouts behind two web hosts;
2. submit and status req/s (bench/loadgen.py's closed loop) with 1 and 2 web hosts, workers running;
3. per submit, per delivery and per status read: the primary's commands (``INFO commandstats``) and CPU
   (``INFO cpu``), and the web and worker hosts' CPU (bench/scale_probe.py) -- a submit window with the
   workers stopped (SIGSTOP), then the drain of that backlog once they continue, then status reads, each
   less an idle window's background; and a 100 ms task's tasks/s per worker process;
4. from 3, the tasks/s one primary carries at one full core, and the hosts that feeds (bench/scale_report.py);
5. submit req/s and latency with TASKPORT_REPLICA_ACK=1 against without, same layout, alternating rounds.

It prints the tables and writes the figures as JSON (``bench/results/scale.json``); bench/RESULTS.md's
section "Scale-out on the multi-host bed" is written by hand from a run. See bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core import keys  # noqa: E402
from app.core.states import TaskStatus  # noqa: E402
from app.web.auth import OPEN_MEMBER  # noqa: E402
from bench import scale_report  # noqa: E402
from bench.scale_probe import Probe, Window  # noqa: E402
from tests.scale.bed import Bed, BedError  # noqa: E402
from tests.scale.cluster import PORT, WEB_HOSTS, Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "bench" / "results" / "scale.json"
DRAIN_TIMEOUT = 180.0
DRAIN_POLL = 0.02  # seconds between two looks at the counters while a backlog drains
SUBMIT_BASES = itertools.count(1)  # each submit window's payloads are unique (no dedup hit across windows)


@dataclass(frozen=True)
class Layout:
    web: tuple[str, ...]
    work: tuple[str, ...]
    per_host: int  # worker processes per worker host

    @property
    def workers(self) -> int:
        return len(self.work) * self.per_host

    @property
    def label(self) -> str:
        workers = f"{self.workers} worker" + "s" * (self.workers > 1)
        return f"{len(self.web)} web, {workers} on {len(self.work)} host" + "s" * (len(self.work) > 1)


SWEEP = [*(Layout(("web1",), ("work1",), n) for n in (1, 2, 4)),  # 1, 2, 4 workers on one worker host
         *(Layout(("web1",), ("work1", "work2"), n) for n in (1, 2))]  # 2, 4 across two


@dataclass(frozen=True)
class Options:
    tasks: int  # per end-to-end run
    window: float  # seconds of each req/s window (after its warm-up)
    warmup: float
    idle: float  # seconds of the idle window each session's background is read from
    rounds: int  # of every measurement, on fresh processes each time; the best counts
    conns: int = 16


FULL = Options(tasks=2000, window=4.0, warmup=1.0, idle=2.0, rounds=2)
QUICK = Options(tasks=400, window=2.0, warmup=0.5, idle=1.0, rounds=1)


def open_mode(bed: Bed) -> dict[str, str]:
    """The web answers without API keys on every interface, to the Host names of the web hosts: the bench's
    generators send no Authorization header (as `make bench`, which runs in open mode too)."""
    allowed = ",".join(bed.hosts[h].ip for h in WEB_HOSTS)
    return {"TASKPORT_API_KEYS": "", "TASKPORT_HOST": "0.0.0.0", "TASKPORT_ALLOW_OPEN": "1",
            "TASKPORT_ALLOWED_HOSTS": allowed}


@dataclass
class Context:
    bed: Bed
    opts: Options
    windows: list[Window] = field(default_factory=list)  # every measured window, for the machine's other load

    def session(self, layout: Layout, extra: dict[str, str] | None = None) -> Session:
        return Session(self, layout, extra)

    def not_bed_share(self) -> float:
        """Share of the machine's CPU that went to processes outside the bed during the windows."""
        seconds = sum(w.seconds for w in self.windows)
        not_bed = sum(w.cores()["not_bed"] * w.seconds for w in self.windows)
        return round(not_bed / (seconds * (os.cpu_count() or 1)), 3) if seconds else 0.0


class Session:
    """One layout's processes on the bed, from a flushed primary, and the measurements made on them."""

    def __init__(self, ctx: Context, layout: Layout, extra: dict[str, str] | None = None) -> None:
        bed = ctx.bed
        self.ctx, self.bed, self.layout, self.opts = ctx, bed, layout, ctx.opts
        self.cluster = Cluster(bed, extra=open_mode(bed) | (extra or {}), web_hosts=layout.web,
                               worker_hosts=layout.work, workers=layout.per_host)
        self.primary = bed.primary()
        self.probe = Probe(bed, self.primary)
        self.background: Window | None = None

    def __enter__(self) -> Session:
        self.bed.redis(self.primary)("FLUSHALL", timeout=10.0)
        self.cluster.start()
        try:
            self.ready_s = self.client("wait", workers=self.layout.workers)["ready_s"]
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.cluster.stop()

    @property
    def hosts(self) -> str:
        return ",".join(self.bed.hosts[h].ip for h in self.layout.web)

    def client(self, mode: str, timeout: float = 240.0, **options: Any) -> dict[str, Any]:
        """bench/scale_client.py on the client host; its JSON answer."""
        argv = [sys.executable, "-m", "bench.scale_client", mode, "--hosts", self.hosts, "--port", str(PORT)]
        for name, value in options.items():
            argv += [f"--{name}", str(value)]
        done = self.bed.run("client", argv, timeout=timeout)
        if done.returncode:
            raise BedError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}\n"
                           f"{self.bed.log_tails(15)}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def measured(self, mode: str, **options: Any) -> tuple[dict[str, Any], Window]:
        """A client run between two snapshots; the window carries the client process's own CPU."""
        before = self.probe.snap()
        result = self.client(mode, **options)
        window = self.probe.window(before, self.probe.snap())
        window.extra_cpu["client"] = result["client_cpu_s"]
        self.ctx.windows.append(window)
        return result, window

    def idle(self) -> Window:
        """The background of this session (nothing submitted, nothing read), once per session."""
        if self.background is None:
            before = self.probe.snap()
            time.sleep(self.opts.idle)
            self.background = self.probe.window(before, self.probe.snap())
        return self.background

    def e2e(self, seconds: float = 0.0, tasks: int | None = None) -> dict[str, Any]:
        self.settle()  # an earlier window's backlog would be delivered inside this one
        idle = self.idle()
        tasks = tasks or self.opts.tasks
        result, window = self.measured("e2e", tasks=tasks, conns=self.opts.conns, seconds=seconds)
        per_worker = result["tasks_per_s"] / self.layout.workers
        return {"layout": self.layout.label, "web_hosts": len(self.layout.web), "workers": self.layout.workers,
                "worker_hosts": len(self.layout.work), **result, "per_worker_process": round(per_worker, 1),
                "cores": window.cores(), "per_task": window.minus(idle).per(result["done"])}

    def load(self, kind: str, conns: int | None = None) -> dict[str, Any]:
        """A closed-loop window of submits, or of status reads of finished tasks (the member's last 1,000)."""
        options: dict[str, Any] = {"kind": kind, "conns": conns or self.opts.conns, "warmup": self.opts.warmup,
                                   "duration": self.opts.window}
        if kind == "status":
            ids = self.bed.redis(self.primary)("ZRANGE", keys.history(OPEN_MEMBER), 0, 999)
            if not ids:
                raise BedError("no task to read: run a submit window first")
            path = self.bed.workdir / "status-ids.txt"
            path.write_text("\n".join(ids) + "\n")
            options["ids"] = path
        else:
            options["base"] = 10**11 + next(SUBMIT_BASES) * 10**8
        self.settle()  # no backlog of an earlier window drains during this one
        idle = self.idle()
        result, window = self.measured("load", **options)
        return {"layout": self.layout.label, **result, "cores": window.cores(),
                "per_request": window.minus(idle).per(result["submitted_total"])}

    def counters(self) -> tuple[int, int]:
        """(submitted, completed) as the store counts them."""
        sub, done = self.probe.command("HMGET", keys.STATS, keys.STAT_SUBMITTED,
                                                 keys.STAT_ENTERED[TaskStatus.COMPLETED])
        return int(sub or 0), int(done or 0)

    def settle(self) -> None:
        """Wait until every submitted task is COMPLETED."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while (left := operator.sub(*self.counters())) > 0:
            if time.monotonic() > deadline:
                raise BedError(f"{left} tasks not COMPLETED after {DRAIN_TIMEOUT} s\n{self.bed.log_tails(15)}")
            time.sleep(DRAIN_POLL)

    def signal_workers(self, signum: int) -> None:
        for proc in self.cluster.procs:
            if proc.name == "worker":
                os.killpg(proc.pid, signum)

    def attribution(self) -> dict[str, Any]:
        """Submits with the workers stopped, then the drain of that backlog once they continue."""
        self.settle()
        idle = self.idle()
        self.signal_workers(signal.SIGSTOP)
        try:
            submit = self.load("submit")
            backlog = self.counters()
            before = self.probe.snap()
            began = time.monotonic()
        finally:
            self.signal_workers(signal.SIGCONT)
        self.settle()
        drained = time.monotonic() - began
        window = self.probe.window(before, self.probe.snap())
        self.ctx.windows.append(window)
        tasks = backlog[0] - backlog[1]
        drain = {"tasks": tasks, "seconds": round(drained, 3), "tasks_per_s": round(tasks / drained, 1),
                 "per_worker_process": round(tasks / drained / self.layout.workers, 1), "cores": window.cores(),
                 "per_task": window.minus(idle).per(tasks)}
        return {"submit_paused": submit, "delivery": drain}


def best_of(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The round with the highest ``key`` (other work on the machine only ever slows a round down), with
    every round's figure beside it."""
    best = max(rows, key=lambda r: r[key])
    return {**best, "rounds": [r[key] for r in rows]}


def sweep(ctx: Context) -> tuple[list[dict[str, Any]], Layout]:
    """Part 1 on one web host, ``rounds`` times (every other round in reverse order); the best worker layout."""
    samples: dict[Layout, list[dict[str, Any]]] = {layout: [] for layout in SWEEP}
    for n in range(ctx.opts.rounds):
        for layout in SWEEP if n % 2 == 0 else SWEEP[::-1]:
            with ctx.session(layout) as session:
                samples[layout].append(session.e2e())
            print(f"  {layout.label}: {samples[layout][-1]['tasks_per_s']:,.0f} tasks/s", flush=True)
    rows = [best_of(samples[layout], "tasks_per_s") for layout in SWEEP]
    best = max(zip(rows, SWEEP, strict=True), key=lambda pair: pair[0]["tasks_per_s"])[1]
    return rows, best


def web_tiers(ctx: Context, best: Layout, out: dict[str, Any]) -> None:
    """Part 2 with one and two web hosts (alternating rounds), and in the first one-web round part 3's
    costs and the 100 ms task; two web hosts' end-to-end row joins the sweep's."""
    two = replace(best, web=WEB_HOSTS)
    runs: dict[str, list[dict[str, Any]]] = {"one_web": [], "two_web": []}
    e2e: list[dict[str, Any]] = []
    for n in range(ctx.opts.rounds):
        for key, layout in (("one_web", best), ("two_web", two)):
            with ctx.session(layout) as session:
                if key == "two_web":
                    e2e.append(session.e2e())
                runs[key].append({"submit": session.load("submit"), "status": session.load("status")})
                if key == "one_web" and n == 0:
                    out["attribution"] = session.attribution()
                    tasks = max(40, ctx.opts.tasks // 40) * best.workers
                    out["task_100ms"] = session.e2e(seconds=0.1, tasks=tasks)
            print(f"  {layout.label}: {runs[key][-1]['submit']['rps']:,.0f} submits/s, "
                  f"{runs[key][-1]['status']['rps']:,.0f} status reads/s", flush=True)
    for key, rows in runs.items():
        out[key] = {kind: best_of([r[kind] for r in rows], "rps") for kind in ("submit", "status")}
    out["sweep"].append(best_of(e2e, "tasks_per_s"))


def replica_ack(ctx: Context, layout: Layout) -> dict[str, Any]:
    """With and without TASKPORT_REPLICA_ACK=1, alternating, fresh processes: a submit window, one on a single
    connection (the latency without queueing), then end to end."""
    rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(ctx.opts.rounds):
        for mode, extra in (("off", {}), ("on", {"TASKPORT_REPLICA_ACK": "1"})):
            with ctx.session(layout, extra) as session:
                rounds[mode].append({"submit": session.load("submit"), "single": session.load("submit", conns=1),
                                     "e2e": session.e2e()})
            print(f"  replica ack {mode}: {rounds[mode][-1]['submit']['rps']:,.0f} submits/s, "
                  f"{rounds[mode][-1]['e2e']['tasks_per_s']:,.0f} tasks/s end to end", flush=True)
    return {"layout": layout.label, **{mode: {"submit": best_of([r["submit"] for r in rows], "rps"),
                                              "single": best_of([r["single"] for r in rows], "rps"),
                                              "e2e": best_of([r["e2e"] for r in rows], "tasks_per_s")}
                                       for mode, rows in rounds.items()}}


def measure(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print("end to end, one web host:", flush=True)
    out["sweep"], best = sweep(ctx)
    print(f"req/s with one and two web hosts, per-operation costs ({best.label}):", flush=True)
    web_tiers(ctx, best, out)
    print(f"replica ack ({best.label}):", flush=True)
    out["replica_ack"] = replica_ack(ctx, best)
    return out


def machine_meta(opts: Options, quick: bool) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "quick": quick, "options": opts.__dict__,
            "loadavg_start": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/scale.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run (1 round, 400 tasks)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (every process's log is in it)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the bed makes network namespaces: run it as root")
    opts = QUICK if args.quick else FULL
    meta = machine_meta(opts, args.quick)
    workdir = Path(tempfile.mkdtemp(prefix="taskport-scale-"))
    began = time.monotonic()
    try:
        with Bed(workdir) as bed:
            bed.start_redis()
            ctx = Context(bed, opts)
            out = measure(ctx)
    finally:
        if args.keep:
            print(f"bench/scale.py: kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    meta |= {"seconds": round(time.monotonic() - began), "not_bed_share": ctx.not_bed_share(),
             "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    out["bound"] = scale_report.bound(out)
    print(scale_report.markdown(meta, out))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, **out}, indent=1) + "\n")
    print(f"bench/scale.py: wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
