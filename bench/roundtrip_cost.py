"""A Redis command's client CPU in one process, by path: redis-py's own ``execute_command``, taskport's
``Client`` (app/core/connection.py), and ``Client`` with the web's one-``send`` connections (``send_in_one``);
with gevent's patched socket (as the web runs) and with a plain blocking one (as a worker runs), which differ only
in how the reply is waited for and the command sent. One greenlet, the embedded server on its unix socket; each
case 10,000 commands a round, rounds interleaved, median and min of the rounds (``time.process_time``).

    .venv/bin/python bench/roundtrip_cost.py                # both: gevent, then plain (a child process each)
    .venv/bin/python bench/roundtrip_cost.py --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(mode: str, rounds: int) -> None:
    if mode == "gevent":
        from gevent import monkey

        monkey.patch_all()
    sys.path.insert(0, str(REPO))
    import redis

    from app.core.config import Config
    from app.core.connection import connect, send_in_one
    from app.core.packer import use_lean_packer
    from tests.integration.harness import RedisServer

    with tempfile.TemporaryDirectory() as work:
        server = RedisServer(Path(work)).start()
        try:
            config = Config.from_env({}, redis_url=server.url, data_dir=Path(work))
            client = connect(config)
            use_lean_packer(client)
            one_send = connect(config)
            use_lean_packer(one_send)
            send_in_one(one_send)
            plain = redis.Redis(connection_pool=client.connection_pool)  # redis-py's path, Client's connections
            client.set("{tp}:bench:key", "a small value of about the size of a status field")
            sha = client.script_load("return redis.call('GET', KEYS[1])")
            cases = {
                "GET, redis-py's path": lambda: plain.get("{tp}:bench:key"),
                "GET, Client": lambda: client.get("{tp}:bench:key"),
                "GET, Client + one send": lambda: one_send.get("{tp}:bench:key"),
                "EVALSHA, redis-py's path": lambda: plain.execute_command("EVALSHA", sha, 1, "{tp}:bench:key"),
                "EVALSHA, Client": lambda: client.execute_command("EVALSHA", sha, 1, "{tp}:bench:key"),
                "EVALSHA, Client + one send": lambda: one_send.execute_command("EVALSHA", sha, 1, "{tp}:bench:key"),
            }
            found: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(rounds):
                for name, call in cases.items():
                    started = time.process_time()
                    for _ in range(10_000):
                        call()
                    found[name].append((time.process_time() - started) / 10_000 * 1e6)
        finally:
            server.close()
    for name, values in found.items():
        print(f"| {mode} | {name} | {statistics.median(values):.1f} | {min(values):.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--mode", choices=("gevent", "plain"), help="one mode, in this process")
    args = parser.parse_args()
    if args.mode:
        measure(args.mode, args.rounds)
        return
    print("| socket | path | µs CPU a command, median | min |\n| --- | --- | --- | --- |", flush=True)
    for mode in ("gevent", "plain"):
        subprocess.run([sys.executable, __file__, "--mode", mode, "--rounds", str(args.rounds)], check=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


if __name__ == "__main__":
    main()
