"""Profiles of the hot paths, on the same real stack as ``make bench`` (``make bench`` does not run this).

    python bench/profile.py            # or: .venv/bin/python bench/profile.py --duration 5

- submit and status read: py-spy samples both gunicorn workers (``--gil``: only the thread holding the
  GIL, i.e. where the CPU goes) while ``bench.loadgen`` drives POST /api/v1/tasks, then GET status;
- a task execution, fork worker: py-spy samples the taskport worker processes and their work horses
  (``--subprocesses``) during a no-op throughput run; the same for bare RQ, as the baseline;
- a task execution, in-process: pyinstrument over a ``SimpleWorker(...).work(burst=True)`` of no-op
  tasks (the call tree of one RQ delivery with taskport's runner inside), and of bare RQ no-ops.

Writes bench/results/profile-*.txt (collapsed stacks summarized: inclusive and self time per function
and per package) and prints where each path spends its time.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core import keys  # noqa: E402
from bench import measure_http  # noqa: E402
from bench.counting import text as reply_text  # noqa: E402
from bench.fill import create_tasks, enqueue_noops  # noqa: E402
from bench.stack import REPO, Stack  # noqa: E402

OUT = REPO / "bench" / "results"
_RECORDERS: list[subprocess.Popen[bytes]] = []
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: pip install -e '.[dev]'")
    return found


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def record(pids: list[int], seconds: float, name: str, subprocesses: bool = False) -> list[Path]:
    """Start py-spy on every pid (in the background) and return the files it will write."""
    files = []
    for pid in pids:
        path = OUT / f"profile-{name}-{pid}.raw"
        argv = [py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                "--format", "raw", "--nonblocking", "-o", str(path)]
        argv += ["--subprocesses"] if subprocesses else ["--gil"]
        _RECORDERS.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        files.append(path)
    return files


def wait_recorders() -> None:
    for proc in _RECORDERS:
        proc.wait(120)
    _RECORDERS.clear()


def package(file: str) -> str:
    parts = file.replace("\\", "/").split("/")
    for marker in ("site-packages", "python3.11", "lib"):
        if marker in parts:
            parts = parts[parts.index(marker) + 1:]
    if parts and parts[0] in ("app", "workers", "bench"):
        return "/".join(parts[:2]) if len(parts) > 1 else parts[0]
    return parts[0].removesuffix(".py") if parts else "?"


def summarize(files: list[Path], title: str, top: int = 30) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            count = int(count_text)
            frames = [_short(f) for f in stack.split(";") if f]
            total += count
            for frame in set(frames):
                inclusive[frame] += count
            if frames:
                own[frames[-1]] += count
                packages[_package_of(frames[-1])] += count
    lines = [f"## {title}: {total} samples", "", "### self time by package"]
    lines += [f"{n / total:6.1%}  {name}" for name, n in packages.most_common(15)] if total else []
    lines += ["", "### inclusive time by function (taskport's own code and the big library steps)"]
    lines += [f"{n / total:6.1%}  {name}" for name, n in inclusive.most_common(400)
              if _interesting(name)][:top] if total else []
    lines += ["", "### self time by function"]
    lines += [f"{n / total:6.1%}  {name}" for name, n in own.most_common(top)] if total else []
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['func']} ({match['file']})"


def _package_of(frame: str) -> str:
    match = re.search(r"\(([^()]+)\)$", frame)
    return package(match.group(1)) if match else "?"


def _interesting(frame: str) -> bool:
    keep = ("app/", "workers/", "flask/app.py", "flask/ctx.py", "werkzeug/", "gunicorn/http", "redis/client.py",
            "redis/connection.py", "redis/commands/core.py", "rq/", "marshmallow/schema.py", "logging/__init__.py",
            "orjson", "uuid.py", "hashlib", "os.py")
    return any(k in frame for k in keep) and "threading.py" not in frame


def web_profiles(stack: Stack, seconds: float) -> str:
    stack.start_web()
    assert stack.web is not None
    workers = children(stack.web.popen.pid)
    env = stack.environ()
    port = stack.config.port
    text = ""
    conn = stack.client()
    with measure_http.listening_worker(conn):  # as in make bench: submits take their usual path
        measure_http.loadgen(port, "submit", conns=16, warmup=1, duration=1, env=env)  # warm, and tasks to read
        ids = [reply_text(m) for m in conn.zrange(keys.history("public"), 0, 9999)]
        ids_file = stack.dir / "ids.txt"
        ids_file.write_text("\n".join(ids))
        for kind in ("hello", "submit", "get", "status"):
            files = record(workers, seconds, f"web-{kind}")
            result = measure_http.loadgen(port, kind, conns=16, warmup=0.5, duration=seconds + 0.5,
                                          ids_file=str(ids_file), base=10_000_000, env=env)
            wait_recorders()
            text += summarize(files, f"gunicorn workers under {kind} ({result['rps']:.0f} req/s while sampled)") + "\n"
    stack.stop(stack.web)
    return text


def worker_profiles(stack: Stack, seconds: float) -> str:
    text = ""
    for bare in (False, True):
        name = "bare-rq" if bare else "taskport"
        conn = stack.client()
        conn.flushall()
        if bare:
            enqueue_noops(conn, 3000)
        else:
            create_tasks(conn, stack.config, 3000, enqueue=True)
        workers = stack.start_workers("fork", 2, bare=bare)
        time.sleep(0.5)
        files = record([w.popen.pid for w in workers], seconds, f"worker-fork-{name}", subprocesses=True)
        wait_recorders()
        stack.stop(*workers)
        text += summarize(files, f"fork workers and work horses, {name}") + "\n"
    return text


def inprocess_profile(stack: Stack, n: int) -> str:
    from pyinstrument import Profiler
    from pyinstrument.renderers import ConsoleRenderer
    from rq import SimpleWorker

    from app.core.states import QUEUES
    from workers import runner

    conn = stack.client()
    text = ""
    runner.use(runner.Runner(stack.config, conn))
    for bare in (False, True):
        conn.flushall()
        if bare:
            enqueue_noops(conn, n)
        else:
            create_tasks(conn, stack.config, n, enqueue=True)
        profiler = Profiler(interval=0.0002)
        profiler.start()
        SimpleWorker(list(QUEUES), connection=conn).work(burst=True, logging_level="WARNING")
        profiler.stop()
        label = "bare RQ no-op" if bare else "taskport no-op task"
        text += f"## SimpleWorker burst of {n} x {label} (pyinstrument)\n\n"
        text += profiler.output(ConsoleRenderer(unicode=False, color=False, show_all=True, short_mode=False,
                                                processor_options={"filter_threshold": 0.015})) + "\n"
    runner.use(None)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description="profile taskport's hot paths (py-spy, pyinstrument)")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--tasks", type=int, default=500, help="no-op tasks in the in-process profile")
    parser.add_argument("--only", choices=("web", "worker", "inprocess"), action="append",
                        help="profile only this path (repeatable); all three by default")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    paths = {"web": lambda stack: web_profiles(stack, args.duration),
             "worker": lambda stack: worker_profiles(stack, args.duration),
             "inprocess": lambda stack: inprocess_profile(stack, args.tasks)}
    with Stack() as stack:
        sections = {name: profile(stack) for name, profile in paths.items() if not args.only or name in args.only}
    for name, text in sections.items():
        path = OUT / f"profile-{name}.txt"
        path.write_text(text)
        print(text)
        print(f"profile: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
