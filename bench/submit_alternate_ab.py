"""A submit's web CPU, two commits side by side, the order of the two swapped every round (``web_cpu_ab.py`` always
runs the before tree first in a round): per round and tree, a ``bench.loadgen --kind submit`` window and a hello
window (``web_cpu_ab.Web`` and ``web_cpu_ab.window``: the same web, argv, app and measures), Redis flushed before
each tree's turn. Medians of the rounds: web CPU µs per submit, per hello, the submit minus the same round's hello,
and submit req/s.

    .venv/bin/python bench/submit_alternate_ab.py --before 1bee3fa --after HEAD --rounds 8
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from bench.measure_http import clean_slate, listening_worker  # noqa: E402
from bench.stack import BENCH_APP_SPEC, Stack  # noqa: E402
from bench.trees import before_and_after  # noqa: E402
from bench.web_cpu_ab import Web, window  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="1bee3fa")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="submit-alternate-"))
    found: dict[str, dict[str, list[float]]] = {}
    try:
        trees = before_and_after(args.before, args.after, work)
        names = list(trees)
        found = {name: {"submit": [], "hello": [], "rps": []} for name in names}
        with Stack() as stack:
            conn, env = stack.client(), stack.environ()
            webs = {name: Web(tree, stack.config, BENCH_APP_SPEC, work / f"{i}.log")
                    for i, (name, tree) in enumerate(trees.items())}
            try:
                with listening_worker(conn) as worker:
                    for i in range(args.rounds):
                        for j, name in enumerate(names if i % 2 == 0 else names[::-1]):
                            clean_slate(conn, worker)
                            submit = window(conn, webs[name], "submit", args.seconds, env, base=(i * 2 + j) * 1_000_000)
                            hello = window(conn, webs[name], "hello", args.seconds, env)
                            found[name]["submit"].append(submit["web_ms"] * 1000)
                            found[name]["hello"].append(hello["web_ms"] * 1000)
                            found[name]["rps"].append(submit["rps"])
                            print(f"round {i + 1} {name}: submit {submit['web_ms'] * 1000:.0f} µs "
                                  f"{submit['rps']:.0f}/s, hello {hello['web_ms'] * 1000:.0f} µs", flush=True)
            finally:
                for web in webs.values():
                    web.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| tree | web CPU µs / submit | / hello | submit − hello, paired | submit req/s |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in found.items():
        paired = [s - h for s, h in zip(rows["submit"], rows["hello"], strict=True)]
        print(f"| {name} | {statistics.median(rows['submit']):.0f} | {statistics.median(rows['hello']):.0f} | "
              f"{statistics.median(paired):.0f} | {statistics.median(rows['rps']):.0f} |")


if __name__ == "__main__":
    main()
