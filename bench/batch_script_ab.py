"""The batch create script alone, before and after (issue 32; not part of ``make bench``): Redis's CPU per task.

    .venv/bin/python bench/batch_script_ab.py --before 1bee3fa [--after HEAD] [--rounds 30]

Each tree (``git archive`` of a commit, bench.trees.archive) captures, in a child process importing its own
``app``, the script, keys and arguments of one real 1,000-task ``POST /api/v1/batches`` (the bench's batch body,
at ``TaskStore.run_script``, as bench/batch_profile.py does). Then one embedded valkey-server (its append-only
file on, as in production) runs the two captured calls alternately, each on a flushed server: the redis-server
process's CPU from ``/proc`` around the EVALSHA (the request read, the script, its AOF copy and the reply), and
``INFO commandstats``' usec of the EVALSHA (wall time: the busy machine's noise).
Prints a markdown table: per task, the mean of the CPU over the rounds and the median (min) of the usec.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo importable

from app.core.config import Config  # noqa: E402
from app.launch.embedded import EmbeddedRedis  # noqa: E402
from bench.process_cpu import own_and_reaped  # noqa: E402
from bench.trees import archive  # noqa: E402

TASKS = 1000
# run in a tree's directory (its ``app`` first on sys.path): pickle the captured call to argv[1]
CAPTURE = """
import logging, pickle, sys, tempfile
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, '.')
from rq import Worker
from app.core import keys
from app.core.config import Config
from app.core.states import QUEUES
from app.core.store import TaskStore
from app.launch.embedded import EmbeddedRedis
from app.web import create_app
from bench.loadgen import batch_body
logging.disable(logging.WARNING)
captured = {}
run_script = TaskStore.run_script
def spy(self, name, keys_, args, client=None, *, acknowledged=False):
    captured[name] = (self._sources[name], [*keys_, keys.AUDIT], list(args))
    return run_script(self, name, keys_, args, client, acknowledged=acknowledged)
TaskStore.run_script = spy
with tempfile.TemporaryDirectory() as tmp:
    base = Config.from_env({}, data_dir=Path(tmp), api_keys='')
    with EmbeddedRedis(base) as server:
        client = create_app(replace(base, redis_url=server.url), conn=server.client(timeout=60)).test_client()
        Worker(list(QUEUES), connection=server.client(timeout=60)).register_birth()
        answer = client.post('/api/v1/batches', data=batch_body(0, __TASKS__), content_type='application/json')
        assert answer.status_code == 202, answer.get_data()
pickle.dump(captured['batch_create'], open(sys.argv[1], 'wb'))
""".replace("__TASKS__", str(TASKS))


def capture(tree: Path, out: Path) -> tuple[str, list[Any], list[Any]]:
    subprocess.run([sys.executable, "-c", CAPTURE, str(out)], cwd=tree, check=True)
    found: tuple[str, list[Any], list[Any]] = pickle.loads(out.read_bytes())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="tp-batch-ab-") as tmp:
        calls: dict[str, tuple[str, list[Any], list[Any]]] = {}
        for side in (args.before, args.after):
            name = archive(side, Path(tmp) / side.replace("/", "_"))
            calls[name] = capture(Path(tmp) / side.replace("/", "_"), Path(tmp) / f"{name}.pickle")
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        usec: dict[str, list[float]] = {name: [] for name in calls}
        with EmbeddedRedis(Config.from_env({}, data_dir=Path(tmp) / "redis", api_keys="")) as server:
            assert server.pid is not None
            conn = server.client(timeout=60)
            shas = {name: conn.script_load(source) for name, (source, _, _) in calls.items()}
            for _ in range(args.rounds):
                for name, (_, keys_, values) in calls.items():
                    conn.flushall()
                    conn.config_resetstat()
                    before = own_and_reaped(server.pid)
                    conn.evalsha(shas[name], len(keys_), *keys_, *values)
                    cpu[name].append((own_and_reaped(server.pid) - before) / TASKS * 1e6)
                    stats: Any = conn.info("commandstats")
                    usec[name].append(stats["cmdstat_evalsha"]["usec"] / TASKS)
    print(f"{args.rounds} rounds, alternating; per task of one {TASKS:,}-task batch create\n")
    print("| script of | Redis process CPU µs (mean) | EVALSHA µs, median (min) | keys + arguments a task |")
    print("| --- | --- | --- | --- |")
    for name, (_, keys_, values) in calls.items():
        print(f"| {name} | {statistics.mean(cpu[name]):.1f} | {statistics.median(usec[name]):.1f} "
              f"({min(usec[name]):.1f}) | {len(keys_) / TASKS:.1f} + {len(values) / TASKS:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
