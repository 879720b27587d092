"""What a Redis round trip costs the web under load: web CPU per request of ``GET /bench/hello`` (no Redis) against
``GET /bench/get`` (one GET through taskport's own client, ``bench.apps.one_get``) and a status read, each through
taskport's app as ``taskport web`` serves it (``bench.stack.bench_web_command``: gunicorn, gevent), with the worker
processes' context switches per request from ``/proc`` (voluntary: the worker slept, its hub finding nothing to
do; involuntary: the machine preempted it). Each window's request minus the same round's hello is the paired
figure: what the request costs beyond the per-request floor, measured back to back.

Several webs of this checkout can run side by side (``--variant NAME:ENV=VALUE,...``: extra environment for one
web, e.g. a setting to A/B), windows alternating between them.

    .venv/bin/python bench/roundtrip_load.py --rounds 5
    .venv/bin/python bench/roundtrip_load.py --rounds 5 --variant a: --variant b:   # an A/A run: the noise
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from app.core import keys  # noqa: E402
from app.core.config import Config, without_settings  # noqa: E402
from app.core.process import free_port  # noqa: E402
from bench.machine import CpuWatch, process_tree_cpu  # noqa: E402
from bench.measure_http import clean_slate, listening_worker, loadgen  # noqa: E402
from bench.stack import BENCH_APP_SPEC, Stack, bench_web_command  # noqa: E402
from bench.web_cpu_ab import server_cpu  # noqa: E402
from tests.integration.harness import wait_until  # noqa: E402


class Web:
    def __init__(self, config: Config, extra: dict[str, str], log: Path) -> None:
        self.port = free_port()
        config = replace(config, port=self.port)
        env = {**without_settings(os.environ), **config.child_environ(), "PYTHONPATH": str(REPO),
               "PYTHONUNBUFFERED": "1", **extra}
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(bench_web_command(config, BENCH_APP_SPEC), cwd=REPO, env=env,
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        wait_until(lambda: requests.get(f"http://127.0.0.1:{self.port}/bench/hello", timeout=1).status_code == 200,
                   timeout=60, ignore=(requests.RequestException,), message=lambda: log.read_text()[-3000:])

    def switches(self) -> tuple[int, int]:
        """Voluntary and involuntary context switches of the worker processes so far."""
        voluntary = involuntary = 0
        with open(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children") as f:
            pids = f.read().split()
        for pid in pids:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary += int(line.split()[1])
        return voluntary, involuntary

    def stop(self) -> None:
        os.killpg(self.popen.pid, signal.SIGTERM)
        self.popen.wait(15)


def window(conn: Any, web: Web, kind: str, seconds: float, env: dict[str, str], ids: Path | None,
           base: int) -> dict[str, float]:
    redis0, web0, switches0 = server_cpu(conn), process_tree_cpu(web.popen.pid), web.switches()
    run = loadgen(web.port, kind, conns=16, warmup=0.5, duration=seconds, ids_file=str(ids) if ids else None,
                  base=base, env=env)
    n = max(int(run["submitted_total"]), 1)
    switches = web.switches()
    return {"web_us": (process_tree_cpu(web.popen.pid) - web0) * 1e6 / n,
            "redis_us": (server_cpu(conn) - redis0) * 1e6 / n, "rps": float(run["rps"]),
            "voluntary": (switches[0] - switches0[0]) / n, "involuntary": (switches[1] - switches0[1]) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--variant", action="append", help="NAME:ENV=VALUE,... (default: one web, as it is)")
    args = parser.parse_args()
    variants = {}
    for spec in args.variant or ["web:"]:
        name, _, rest = spec.partition(":")
        variants[name] = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
    kinds = ("hello", "get", "status")
    watch = CpuWatch().start()
    work = Path(tempfile.mkdtemp(prefix="roundtrip-load-"))
    found: dict[tuple[str, str], list[dict[str, float]]] = {(v, k): [] for v in variants for k in kinds}
    with Stack() as stack:
        conn, env = stack.client(), stack.environ()
        webs = {name: Web(stack.config, extra, work / f"{name}.log") for name, extra in variants.items()}
        try:
            with listening_worker(conn) as worker:
                for i in range(args.rounds):
                    for j, name in enumerate(variants):
                        clean_slate(conn, worker)
                        base = (i * len(variants) + j) * 1_000_000
                        loadgen(webs[name].port, "submit", conns=16, warmup=0, duration=1, env=env, base=base)
                        ids = work / "ids.txt"
                        ids.write_text("\n".join(m.decode() for m in conn.zrange(keys.history("public"), 0, -1)))
                        for kind in kinds:
                            found[(name, kind)].append(window(conn, webs[name], kind, args.seconds, env,
                                                              ids if kind == "status" else None, base))
                        print(f"round {i + 1} {name}: " + "  ".join(
                            f"{k} {found[(name, k)][-1]['web_us']:.0f} µs {found[(name, k)][-1]['rps']:.0f}/s"
                            for k in kinds), flush=True)
        finally:
            for web in webs.values():
                web.stop()
    print("\n| variant | request | web CPU µs / request, median [min–max] | paired, minus hello | req/s | "
          "Redis CPU µs | voluntary / involuntary switches a request |\n| --- | --- | --- | --- | --- | --- | --- |")
    for name in variants:
        for kind in kinds:
            rows = found[(name, kind)]
            cpu = [r["web_us"] for r in rows]
            paired = [r["web_us"] - h["web_us"] for r, h in zip(rows, found[(name, "hello")], strict=True)]
            print(f"| {name} | {kind} | {statistics.median(cpu):.0f} [{min(cpu):.0f}–{max(cpu):.0f}] | "
                  f"{statistics.median(paired):.0f} ({', '.join(f'{p:.0f}' for p in paired)}) | "
                  f"{statistics.median(r['rps'] for r in rows):.0f} | "
                  f"{statistics.median(r['redis_us'] for r in rows):.1f} | "
                  f"{statistics.median(r['voluntary'] for r in rows):.2f} / "
                  f"{statistics.median(r['involuntary'] for r in rows):.2f} |")
    print(f"\nmachine: {json.dumps(watch.report())}")


if __name__ == "__main__":
    main()
