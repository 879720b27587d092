"""Result downloads from an S3 store: streamed through the API vs a presigned URL (what a redirect
would hand the client). Standalone: ``.venv/bin/python bench/download.py [--mib 50] [--runs 5]``.

It starts, in a temp dir, the embedded redis-server, moto's standalone S3 server (``moto_server``, its
own process) and ``taskport web`` (gunicorn, production flags) with ``TASKPORT_RESULT_STORE=s3://...``;
writes one export-sized object through the product's ``S3ResultStore`` and records a COMPLETED task
that names it (through ``TaskStore``, as a worker would). Then, alternating, it downloads the file
``--runs`` times each way: ``GET /api/v1/tasks/{id}/result/file`` (the web reads the object and
streams it) and a GET of ``S3ResultStore.presign(...)`` straight from the S3 server. Figures: wall
time and MiB/s per download, time to first byte, and the CPU seconds the web processes spent
(from /proc), per GiB. The S3 server and the client are on the same host, so the two paths share
the same network; a remote S3 makes the streamed path pay the S3 leg twice (store -> web -> client).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from app.core.answers import NewTask
from app.core.config import Config  # noqa: E402
from app.core.process import free_port  # noqa: E402
from app.core.s3store import S3ResultStore  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from app.launch.cli import web_command  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402

MIB = 1024 * 1024
AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def wait_for(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def cpu_seconds(root_pid: int) -> float:
    """utime + stime of ``root_pid`` and its children (gunicorn's master and its workers), from /proc."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if root_pid in (pid, ppid):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def fetch(url: str) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds in all, bytes) of one streamed GET."""
    started = time.perf_counter()
    first, size = 0.0, 0
    with requests.get(url, stream=True, timeout=120) as r:
        r.raise_for_status()
        for block in r.iter_content(MIB):
            if not size:
                first = time.perf_counter() - started
            size += len(block)
    return first, time.perf_counter() - started, size


def completed_task(conn: Any, config: Config, store: S3ResultStore, mib: int) -> str:
    """A COMPLETED task whose result names an object of ``mib`` MiB, written as a worker writes it."""
    task_id = str(uuid.uuid4())
    tasks = TaskStore(conn, config)
    tasks.create(NewTask(task_id, "public", "orders.export", {"rows": 1}, task_id, "default", 1))
    tasks.start(task_id, "run")
    block = bytes(range(256)) * 4096
    with store.writer(task_id, "export.csv") as fh:
        for _ in range(mib):
            fh.write(block)
    file = {"name": "export.csv", "size": mib * MIB, "content_type": "text/csv; charset=utf-8",
            "url": f"/api/v1/tasks/{task_id}/result/file"}
    tasks.complete(task_id, "run", {"rows": 1, "file": file}, items=None, failures=[], error_code=None)
    return task_id


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, list[tuple[float, float, int, float]]]:
    s3_port, bucket = free_port(), "bench"
    endpoint = f"http://127.0.0.1:{s3_port}"
    env = {**os.environ, **AWS, "AWS_ENDPOINT_URL": endpoint}
    os.environ.update({**AWS, "AWS_ENDPOINT_URL": endpoint})
    procs: list[subprocess.Popen[bytes]] = []
    base = Config.from_env({}, data_dir=tmp, result_store=f"s3://{bucket}/tp", host="127.0.0.1", port=free_port(),
                           web_concurrency=1, log_level="WARNING")
    with EmbeddedRedis(base).start() as redis_server:
        config = Config.from_env({}, **{**base.__dict__, "redis_url": redis_server.url})
        try:
            procs.append(subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for(endpoint)
            store = S3ResultStore(bucket, "tp", scratch=tmp / "scratch")
            store.client.create_bucket(Bucket=bucket)
            task_id = completed_task(redis_server.client(), config, store, args.mib)
            web = subprocess.Popen(web_command(config), env={**env, **config.child_environ()},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(web)
            api = f"http://127.0.0.1:{config.port}"
            wait_for(api + "/healthz")
            fetch(f"{api}/api/v1/tasks/{task_id}/result/file")  # warm-up: connections, imports
            runs: dict[str, list[tuple[float, float, int, float]]] = {"streamed": [], "presigned": []}
            for _ in range(args.runs):
                for way in runs:
                    cpu = cpu_seconds(web.pid)
                    url = (f"{api}/api/v1/tasks/{task_id}/result/file" if way == "streamed"
                           else store.presign(task_id, "export.csv", 300))
                    first, total, size = fetch(url)
                    assert size == args.mib * MIB, (way, size)
                    runs[way].append((first, total, size, cpu_seconds(web.pid) - cpu))
            return runs
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=50, help="size of the file (default 50 MiB)")
    parser.add_argument("--runs", type=int, default=5, help="downloads each way (default 5); medians are shown")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="taskport-bench-download-") as tmp:
        runs = measure(args, Path(tmp))
    print(f"download of a {args.mib} MiB result, {args.runs} runs each way, alternating; medians\n")
    print("| way | time to first byte, ms | seconds per download | MiB/s | web CPU s per GiB |")
    print("| --- | --- | --- | --- | --- |")
    for way, rs in runs.items():
        first, total = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        cpu = statistics.median(r[3] for r in rs) * 1024 / args.mib
        print(f"| {way} | {first * 1000:.0f} | {total:.2f} | {args.mib / total:.0f} | {cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
