"""The status read's place script (``app.core.lines.PLACE``) alone, two commits side by side: Redis CPU and EVALSHA
time per call, and the commands it runs (``make bench`` does not run this; bench/README.md, "Status read, sixth
pass").

One valkey-server (``bench.stack.Stack``) holds ``--tasks`` PENDING tasks of one member (the default queue, no rate
yet: the bench's status row), created through this tree's ``TaskStore``. Each commit's ``app/core/lines.py`` (``git
show``) is imported on its own and its ``PLACE_SOURCE`` loaded; both must give every task the same place (checked
first). A round, commit after commit: ``--calls`` EVALSHAs over the tasks, pipelined (no round trip per call: the
script's own cost, not the network's), around them ``INFO cpu`` and ``INFO commandstats``. Medians of the rounds.

    .venv/bin/python bench/place_ab.py --before 4b05e54 --after HEAD --rounds 9
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from app.core import keys  # noqa: E402
from app.core.answers import NewTask  # noqa: E402
from app.core.jobs import JobQueue  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from bench.stack import Stack  # noqa: E402


def lines_of(rev: str, work: Path) -> ModuleType:
    """``app/core/lines.py`` as it is at ``rev``, imported under a name of its own."""
    source = subprocess.run(["git", "show", f"{rev}:app/core/lines.py"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout
    path = work / f"lines_{len(list(work.iterdir()))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_round(conn: Any, sha: str, task_keys: list[str], calls: int) -> dict[str, float]:
    conn.config_resetstat()
    cpu0: Any = conn.info("cpu")
    pipe = conn.pipeline(transaction=False)
    for i in range(calls):
        pipe.evalsha(sha, 1, task_keys[i % len(task_keys)])
    pipe.execute()
    cpu1: Any = conn.info("cpu")
    stats: Any = conn.info("commandstats")
    used = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_user", "used_cpu_sys"))
    inside = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_info",
                                                                     "cmdstat_config"))
    return {"cpu_us": used * 1e6 / calls, "evalsha_us": float(stats["cmdstat_evalsha"]["usec_per_call"]),
            "commands": inside / calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Stack() as stack:
        work = Path(tmp)
        trees = {rev: lines_of(rev, work) for rev in (args.before, args.after)}
        conn = stack.client()
        store, jobs = TaskStore(conn, stack.config), JobQueue(conn, stack.config)
        ids = []
        for _ in range(args.tasks):
            new = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={},
                          dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1)
            store.create(new, jobs.job_commands(new.task_id, "default", 60, member="public"))
            ids.append(new.task_id)
        task_keys = [keys.task(i) for i in ids]
        shas = {rev: conn.script_load(module.PLACE_SOURCE) for rev, module in trees.items()}
        places = {rev: [module.place_of(conn.evalsha(shas[rev], 1, key)) for key in task_keys]
                  for rev, module in trees.items()}
        if places[args.before] != places[args.after]:
            raise SystemExit(f"the places differ: {places}")
        results: dict[str, list[dict[str, float]]] = {rev: [] for rev in trees}
        for _ in range(args.rounds):
            for rev in trees:
                results[rev].append(one_round(conn, shas[rev], task_keys, args.calls))
    print(f"PLACE alone, {args.tasks} PENDING tasks of one member, {args.calls} pipelined calls a round, "
          f"{args.rounds} rounds, medians")
    for rev, rounds in results.items():
        print(f"{rev}: " + ", ".join(f"{name} {statistics.median(r[name] for r in rounds):.2f}"
                                     for name in ("cpu_us", "evalsha_us", "commands")))


if __name__ == "__main__":
    main()
