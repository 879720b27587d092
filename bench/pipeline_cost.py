"""CPU a pipeline's ``execute`` costs through taskport's client (issue 32, "Pipelines through the short path").

Starts an embedded server on a unix socket in a temporary directory, builds the client as a worker does
(``connect`` + ``LeanPacker``), and times, in this process, ``--calls`` executions of a pipeline of ``--commands``
commands (GETs of one small key; without and with MULTI/EXEC) with ``time.process_time``, redis-py's own
``Pipeline`` and ``Client.pipeline``'s (:class:`app.core.connection.LeanPipeline`) alternating round by round: the
least and the median of ``--rounds``. Also one GET alone, and the OpenTelemetry recorder's one lookup alone.

    .venv/bin/python bench/pipeline_cost.py [--calls 20000] [--rounds 7] [--commands 1 2 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from redis.client import Pipeline
from redis.observability import recorder

from app.core.config import Config
from app.core.connection import connect
from app.core.packer import use_lean_packer
from app.launch.embedded import EmbeddedRedis


def best(fn, calls: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """µs of CPU a call: the least of ``rounds`` rounds of ``calls`` calls."""
    out = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(calls):
            fn()
        out.append((time.process_time() - t) / calls * 1e6)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--commands", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = EmbeddedRedis(Config.from_env({}, data_dir=Path(d)))
        server.start()
        try:
            client = connect(Config.from_env({}, redis_url=server.url, data_dir=Path(d)))
            use_lean_packer(client)
            client.set("k", "v")
            lookup = best(lambda: recorder.record_operation_duration("GET", 0.0), a.calls, a.rounds)
            print(f"recorder lookup alone: {lookup:.2f} µs")
            print(f"one GET, no pipeline: {best(lambda: client.get('k'), a.calls, a.rounds):.2f} µs")
            kinds = {"redis-py": lambda tx: Pipeline(client.connection_pool, client.response_callbacks, tx, None),
                     "taskport": lambda tx: client.pipeline(transaction=tx)}
            for n in a.commands:
                for tx in (False, True):
                    figures: dict[str, list[float]] = {k: [] for k in kinds}
                    for _ in range(a.rounds):  # the two alternate, a round each, so both see the same machine
                        for name, make in kinds.items():
                            def run(make=make, tx=tx, n=n) -> None:  # type: ignore[no-untyped-def]
                                pipe = make(tx)
                                for _ in range(n):
                                    pipe.get("k")
                                pipe.execute()
                            figures[name].append(best(run, a.calls, 1))
                    label = "MULTI/EXEC" if tx else "no MULTI"
                    print(f"pipeline of {n} GET, {label}: " + ", ".join(
                        f"{k} {min(v):.2f} µs (median {statistics.median(v):.2f})" for k, v in figures.items()))
            client.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
