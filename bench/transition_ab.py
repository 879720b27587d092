"""TRANSITION's Lua of two commits on one server, in interleaved blocks: its EVALSHA's usec a call (the whole script).

bench/script_cost.py runs one tree's scripts against a server of its own, one tree after the other, and on a
machine shared with other work its figures move by ±30 % from run to run: more than a change of the Lua's layout
moves them. Here both sources run against the same valkey-server (``bench.stack.Stack``, AOF as ``make up`` runs
it), through the same TaskStore (this tree's; the script's table of keys and arguments must be the same in both),
in blocks of ``--tasks`` completions, the two sources alternating block by block (the order swapped every
block), each block's tasks created and started afresh. Per source: every block's usec a call, the min and the
median, and how many blocks it was the cheaper. bench/README.md, "A delivery, third round".

    .venv/bin/python bench/transition_ab.py --before b6ecf19 --blocks 16
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from app.core.config import Config  # noqa: E402
from app.core.store import TaskStore  # noqa: E402
from bench.fill import create_tasks  # noqa: E402
from bench.stack import Stack  # noqa: E402
from bench.trees import archive  # noqa: E402

SOURCE = ("import sys\nfrom app.core.config import Config\nfrom app.core.scripts import build\n"
          "sys.stdout.write(build(*Config().audit_limits)['transition'])")


def source_of(rev: str, work: Path) -> tuple[str, str]:
    """(short hash, TRANSITION's source as that commit's TaskStore loads it)."""
    short = archive(rev, work)
    text = subprocess.run([sys.executable, "-c", SOURCE], cwd=work, env={"PYTHONPATH": str(work)}, check=True,
                          capture_output=True, text=True).stdout
    return short, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=300)
    opts = parser.parse_args()
    name, before = source_of(opts.before, Path(tempfile.mkdtemp(prefix="transition-ab-")) / "tree")
    with Stack() as stack:
        url = stack.redis_server.url
        config = Config.from_env({}, data_dir=tempfile.mkdtemp(prefix="transition-ab-"), redis_url=url, api_keys="")
        conn = redis.Redis.from_url(url, socket_timeout=30)
        stores = {name: TaskStore(conn, config), "HEAD": TaskStore(conn, config)}
        stores[name]._scripts["transition"] = conn.register_script(before)
        usec: dict[str, list[float]] = {side: [] for side in stores}
        base = 90_000_000
        for block in range(opts.blocks):
            for side in (list(stores) if block % 2 == 0 else list(reversed(stores))):
                store = stores[side]
                ids = create_tasks(conn, config, opts.tasks, enqueue=False, base=base)
                base += opts.tasks
                for i, task_id in enumerate(ids):
                    store.start(task_id, f"r{i}")
                conn.config_resetstat()
                for i, task_id in enumerate(ids):
                    assert store.complete(task_id, f"r{i}", None, items=None, failures=[], error_code=None)
                stats = conn.info("commandstats")["cmdstat_evalsha"]
                usec[side].append(stats["usec"] / stats["calls"])
    cheaper = sum(h < b for h, b in zip(usec["HEAD"], usec[name], strict=True))
    for side, values in usec.items():
        print(f"{side:8s} min {min(values):5.1f} median {statistics.median(values):5.1f} us a call:",
              " ".join(f"{v:.1f}" for v in values))
    print(f"HEAD/{name} median {statistics.median(usec['HEAD']) / statistics.median(usec[name]):.2f}x; "
          f"HEAD cheaper in {cheaper} of {opts.blocks} blocks")


if __name__ == "__main__":
    main()
