"""The SUBMIT script alone, two trees side by side: Redis CPU and the EVALSHA's time per call (``make bench`` does not
run this; bench/README.md "Submit, fifth pass" reads it).

Each tree (``git archive`` of a commit) makes one submit in a child process, its own ``app`` first on ``sys.path``,
against a valkey of its own, and hands back its SUBMIT source and that call's KEYS and ARGV. Then, on one
valkey-server (the embedded one, AOF everysec as ``taskport up`` runs it), for each round and each tree in turn:
FLUSHALL, the tree's source loaded, and its captured call sent ``--calls`` times (100 a pipeline), each time with
a fresh task id and dedup key (a new task every time, as a submit makes it). Per call: the server's ``INFO cpu``
(user + sys) and ``INFO commandstats`` (the EVALSHA's ``usec_per_call``, and every command it ran). The script's
cost without the web, the socket per request or the machine's other work: what a change to the Lua saves.

    .venv/bin/python bench/submit_script_ab.py --before 50bf7a5 --after HEAD --rounds 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from bench.trees import before_and_after  # noqa: E402
from tests.integration.harness import RedisServer  # noqa: E402

CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import redis
from app.core import processors
from app.core.config import Config
from app.web.service import TaskService
from tests.integration.harness import RedisServer

server = RedisServer(Path(sys.argv[2])).start()
try:
    config = Config.from_env({}, redis_url=server.url, data_dir=Path(sys.argv[2]))
    processors.load(config.processor_modules)
    service = TaskService(redis.Redis.from_url(server.url), config)
    sent = {}
    run = service.store.run_script
    def kept(name, keys_, args, *rest, **options):
        if name == "submit":
            sent.update(keys=[*keys_, "{tp}:audit"], args=list(args))
        return run(name, keys_, args, *rest, **options)
    service.store.run_script = kept
    service.submit("public", "demo.sleep", {"seconds": 0, "label": "x"}, None, None)  # its line exists from now on
    outcome = service.submit("public", "demo.sleep", {"seconds": 0, "label": "y"}, None, None)
    text = lambda v: v.decode("latin-1") if isinstance(v, bytes) else str(v)
    print(json.dumps({"source": service.store._sources["submit"], "task_id": outcome.task_id,
                      "keys": [text(k) for k in sent["keys"]], "args": [text(a) for a in sent["args"]]}))
finally:
    server.close()
"""


def capture(tree: Path, work: Path) -> dict[str, Any]:
    """The tree's SUBMIT source and one call of it (a plain submit, its member's line already there)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(work)], cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def calls(captured: dict[str, Any], n: int) -> list[tuple[list[bytes], list[bytes]]]:
    """``n`` copies of the captured call, each with a fresh task id (every key and argument naming it) and dedup
    key (KEYS[1])."""
    old = captured["task_id"]
    out = []
    for _ in range(n):
        new = str(uuid.uuid4())
        keys_ = [k.replace(old, new).encode("latin-1") for k in captured["keys"]]
        keys_[0] += new.encode()
        out.append((keys_, [a.replace(old, new).encode("latin-1") for a in captured["args"]]))
    return out


def one_round(conn: redis.Redis, captured: dict[str, Any], n: int) -> dict[str, float]:
    conn.flushall()
    sha = conn.script_load(captured["source"])
    sent = calls(captured, n)
    conn.config_resetstat()
    before = conn.info("cpu")
    for i in range(0, n, 100):
        pipe = conn.pipeline(transaction=False)
        for keys_, args in sent[i:i + 100]:
            pipe.evalsha(sha, len(keys_), *keys_, *args)
        pipe.execute()
    after = conn.info("cpu")
    stats = conn.info("commandstats")
    cpu = sum(after[f] - before[f] for f in ("used_cpu_user", "used_cpu_sys"))
    commands = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_config|resetstat", "cmdstat_info"))
    return {"cpu_us": cpu / n * 1e6, "evalsha_us": stats["cmdstat_evalsha"]["usec_per_call"],
            "commands": commands / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="50bf7a5")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and tree")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="submit-ab-") as tmp:
        work = Path(tmp)
        trees = before_and_after(opts.before, opts.after, work / "trees")
        captured = {}
        for i, (name, tree) in enumerate(trees.items()):
            (work / f"capture{i}").mkdir()
            captured[name] = capture(tree, work / f"capture{i}")
        (work / "redis").mkdir()
        server = RedisServer(work / "redis").start()
        try:
            conn = server.client()
            results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for r in range(opts.rounds):
                for name in trees:
                    results[name].append(one_round(conn, captured[name], opts.calls))
                    print(f"round {r + 1} {name}: {json.dumps(results[name][-1])}", flush=True)
        finally:
            server.close()
    print(f"\n{opts.calls} calls a round, {opts.rounds} rounds, alternating; median (min)\n")
    print("| SUBMIT of | Redis CPU µs a call | EVALSHA µs a call | commands a call |\n| --- | --- | --- | --- |")
    for name, rows in results.items():
        cell = {f: f"{statistics.median(r[f] for r in rows):.1f} ({min(r[f] for r in rows):.1f})"
                for f in ("cpu_us", "evalsha_us")}
        commands = statistics.median(r["commands"] for r in rows)
        print(f"| {name} | {cell['cpu_us']} | {cell['evalsha_us']} | {commands:.2f} |")


if __name__ == "__main__":
    main()
