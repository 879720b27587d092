"""Status reads with a read token beside status reads with an API key (issue 30: ≥ 0.95× the key's req/s).

One gunicorn with API keys (``benchkey`` for the member ``public``, whose finished tasks bench.stored copies) and
no rate limit (the limiter's cost is the same for both and is measured elsewhere); :data:`TASKS` finished tasks;
the same load generator (bench.loadgen) reads them in alternating rounds, each side opening one in turn: with
``Authorization: Bearer benchkey``, with ``Authorization: Bearer <the task's own read token>``, and with
``?access_token=<token>`` (what an EventSource sends). Each of the :data:`TASKS` pages polls with its own token, so
each web process verifies each token once and then finds it among the ones it keeps (app.web.tokens.VERIFIED_KEPT).
Best of ``rounds`` each, as every HTTP row. In-process: the CPU per read of each side through the app's WSGI
callable (what a busy machine skews less), and the cost of one verification that finds no kept token.
"""

from __future__ import annotations

import time
import timeit
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from werkzeug.test import EnvironBuilder

from app.core.clock import now_ms
from app.core.config import Config
from app.core.store import TaskStore
from app.web import create_app
from app.web.auth import OPEN_MEMBER
from app.web.tokens import TASK, Tokens
from bench import report
from bench.measure_http import best, clean_slate, loadgen
from bench.stack import Stack
from bench.stored import copy_tasks, finished_template, quiesce

KEY = "benchkey"
TASKS = 1_000  # distinct tasks (pages), each read with its own token
TARGET = 0.95  # issue 30: a status read with a token is at least 0.95× the speed of one with a key
SIDES = ("key", "token", "query")
IN_PROCESS_READS = 5_000


def measure(stack: Stack, conns: int, warmup: float, duration: float, rounds: int) -> dict[str, Any]:
    config = replace(stack.config, api_keys=f"{KEY}:{OPEN_MEMBER}", rate_limit="off")
    conn = stack.client()
    clean_slate(conn)
    template, ttl_ms = finished_template(conn, TaskStore(conn, config))
    ids = copy_tasks(conn, template, ttl_ms, TASKS)
    tokens = Tokens(conn, config, OPEN_MEMBER)  # the secret it stores is the one the web reads
    minted = [tokens.mint(TASK, task_id, KEY, 3600, now_ms())["token"] for task_id in ids]
    files = {name: stack.dir / f"tokens-{name}.txt" for name in ("ids", "query_ids", "key", "tokens")}
    Path(files["ids"]).write_text("\n".join(ids))
    Path(files["query_ids"]).write_text("\n".join(f"{i}?access_token={t}" for i, t in zip(ids, minted, strict=True)))
    Path(files["key"]).write_text(KEY)
    Path(files["tokens"]).write_text("\n".join(minted))
    quiesce(conn)
    serving = stack.web is not None
    stack.start_web(config)
    try:
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for i in range(rounds):
            for side in SIDES[i % len(SIDES):] + SIDES[:i % len(SIDES)]:  # each side first in a round in turn
                ids_file, bearers = {"key": (files["ids"], files["key"]), "token": (files["ids"], files["tokens"]),
                                     "query": (files["query_ids"], None)}[side]
                runs[side].append(loadgen(config.port, "status", conns=conns, warmup=warmup if i == 0 else
                                          min(warmup, 1.0), duration=duration, ids_file=str(ids_file),
                                          env=stack.environ(config),
                                          bearers_file=str(bearers) if bearers else None))
    finally:
        if serving:
            stack.start_web()  # the stack's own web again, for the parts after this one
        elif stack.web is not None:
            stack.stop(stack.web)
    out: dict[str, Any] = {side: best(found) for side, found in runs.items()}
    out["tasks"] = TASKS
    out["first_verify_us"] = first_verify_us(tokens, minted)
    out["in_process_us"] = in_process_us(config, conn, ids, minted)
    conn.flushall()
    conn.close()
    return out


def first_verify_us(tokens: Tokens, minted: list[str]) -> float:
    """µs of one verification that finds no kept token (the signature checked, the payload parsed)."""
    signing = tokens.signing()
    token = minted[0]
    now = now_ms()

    def once() -> None:
        signing.verified.clear()
        tokens.verify(token, now)

    n = 20_000
    spent = min(timeit.repeat(once, number=n, repeat=3))
    return round(spent / n * 1e6, 1)


def in_process_us(config: Config, conn: redis.Redis, ids: list[str], minted: list[str],
                  reads: int = IN_PROCESS_READS, rounds: int = 3) -> dict[str, float]:
    """CPU µs per status read through the whole Flask app in this process (its WSGI callable on prebuilt environs:
    no client's cost counted; the stack's Redis), with the key, each task's token in the header, and in the query,
    alternating, the best of ``rounds``: the paths' own cost, which a busy machine skews less (CPU, not wall time)."""
    app = create_app(config, conn=conn)
    paths = [f"/api/v1/tasks/{task_id}" for task_id in ids]
    built = {"key": [EnvironBuilder(path=p, headers={"Authorization": f"Bearer {KEY}"}) for p in paths],
             "token": [EnvironBuilder(path=p, headers={"Authorization": f"Bearer {t}"})
                       for p, t in zip(paths, minted, strict=True)],
             "query": [EnvironBuilder(path=p, query_string={"access_token": t})
                       for p, t in zip(paths, minted, strict=True)]}
    environs = {side: [b.get_environ() for b in builders] for side, builders in built.items()}
    statuses: list[str] = []

    def start_response(status: str, _headers: Any, _exc: Any = None) -> None:
        statuses.append(status)

    spent: dict[str, list[float]] = {side: [] for side in environs}
    for _ in range(rounds):
        for side, sent in environs.items():
            statuses.clear()
            started = time.process_time()
            for n in range(reads):
                for _chunk in app.wsgi_app(dict(sent[n % len(sent)]), start_response):
                    pass
            spent[side].append((time.process_time() - started) / reads * 1e6)
            assert set(statuses) == {"200 OK"}, (side, set(statuses))
    return {side: round(min(values), 1) for side, values in spent.items()}


def rows(found: dict[str, Any]) -> list[report.Row]:
    key, token, query = found["key"], found["token"], found["query"]
    ratio = report._ratio(token["rps"], key["rps"])
    query_ratio = report._ratio(query["rps"], key["rps"])
    cpu = found["in_process_us"]
    cpu_ratio = report._ratio(cpu["key"], cpu["token"])
    measured = f"status GET /api/v1/tasks/{{id}} over {found['tasks']:,} tasks"
    return [
        report.Row(f"{measured}, each with its own read token (Authorization: Bearer) vs with the API key",
                   f"{token['rps']:,.0f} req/s, p99 {token['p99_ms']:.1f} ms",
                   f"{key['rps']:,.0f} req/s, p99 {key['p99_ms']:.1f} ms", f"{ratio:.2f}×", f"≥ {TARGET}×",
                   report._check(ratio >= TARGET)),
        report.Row(f"{measured}, the token as ?access_token= (EventSource's way) vs with the API key",
                   f"{query['rps']:,.0f} req/s, p99 {query['p99_ms']:.1f} ms",
                   f"{key['rps']:,.0f} req/s", f"{query_ratio:.2f}×"),
        report.Row("CPU per status read in-process (the Flask app's WSGI callable and its hooks, the stack's Redis), "
                   "each task's token vs the API key: their cost without the machine's other load",
                   f"{cpu['token']:.0f} µs", f"{cpu['key']:.0f} µs", f"{cpu_ratio:.2f}× the key's speed"),
        report.Row("CPU per status read in-process, the token as ?access_token= vs the API key",
                   f"{cpu['query']:.0f} µs", f"{cpu['key']:.0f} µs",
                   f"{report._ratio(cpu['key'], cpu['query']):.2f}× the key's speed"),
        report.Row("one read token's first verification (itsdangerous HMAC-SHA256, in-process; later reads find it "
                   "kept)", f"{found['first_verify_us']:.1f} µs"),
    ]
