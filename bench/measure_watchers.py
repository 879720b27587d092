"""Status polls beside 0 / 100 / 1,000 live SSE watchers, and the serving model they run on.

One phase per (worker class, watcher count), on the same stack, in one run:

- ``TASKS`` tasks are created over HTTP and started (PROCESSING), as if each had a running worker;
- ``bench.watchers`` (its own process) opens the watchers, spread evenly over those tasks, and
  reports ``ready`` once every stream has sent its snapshot;
- a changer thread here writes a progress change to one task after another, each task every
  ``CHANGE_INTERVAL`` s (the default progress interval), through the product's ``TaskStore.report``
  (the Lua script that bumps ``seq`` and PUBLISHes), during the warm-up and the window;
- first, for ``STREAMS_WINDOW`` s, nothing else: the web's CPU then is what the streams cost by
  themselves (``streams_only``: share of a core, µs per delivered event);
- then ``bench.loadgen --kind status`` polls those tasks over 16 keep-alive connections meanwhile.

After the window the changer stops, and the watchers get ``GRACE`` s to receive what is in flight
(the target is delivery within 1 s) before they are stopped and report. A change a watcher did
not receive is *missed*: either *coalesced* (its id was jumped over: the server sent a later state
in its place, as the contract allows when a change lands before the previous one was read) or *lost*
(neither). The same changer runs with 0 watchers, so every row pays for the writes.

Serving models: the gthread worker (taskport's model before the event hub: a thread per request,
2 × 8 of them) is measured with 0 watchers only, since 16 watchers would take all its threads; the
gevent worker (the default) with 0, 100 and 1,000 (ascending, then descending in the next round).
Both alternate for ``--rounds`` rounds and the best round of each row counts (other work on a shared
machine only ever slows a round down).
``docs/streams.md`` and bench/README.md ("Serving model") read these rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from typing import Any

from app.core import keys
from app.core.connection import connect
from app.core.store import TaskStore
from bench.machine import process_tree_cpu
from bench.measure_http import loadgen
from bench.stack import REPO, Stack

TASKS = 20
CHANGE_INTERVAL = 0.5  # seconds between two changes of one task
GRACE = 1.5  # seconds after the last change before the watchers stop (delivery target: 1 s)
STREAMS_WINDOW = 3.0  # seconds of changes without polls: the web's CPU for the streams alone
COUNTS = (0, 100, 1000)
MEMBER = "public"


class Changer(threading.Thread):
    """Writes a progress change to each task every ``CHANGE_INTERVAL`` s, spread evenly, until stopped."""

    def __init__(self, store: TaskStore, ids: list[str]) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.ids = ids
        self.done = threading.Event()
        self.changes: Counter[str] = Counter()

    def run(self) -> None:
        step = CHANGE_INTERVAL / len(self.ids)
        tick = 0
        while not self.done.is_set():
            tick += 1
            for task_id in self.ids:
                if self.done.wait(step):
                    return
                self.store.report(task_id, "bench-run", min(tick, 99), f"tick {tick}")
                self.changes[task_id] += 1

    def stop(self) -> Counter[str]:
        self.done.set()
        self.join()
        return self.changes


def create_tasks(stack: Stack, store: TaskStore, base: int) -> list[str]:
    """``TASKS`` PROCESSING tasks, submitted over HTTP (unique payloads from ``base`` on) and started."""
    ids = []
    for n in range(base, base + TASKS):
        payload = {"seconds": 3600, "steps": 1, "fail_items": [n]}
        body = json.dumps({"type": "demo.sleep", "payload": payload}).encode()
        req = urllib.request.Request(stack.base_url + "/api/v1/tasks", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as response:
            task_id = json.loads(response.read())["task_id"]
        store.start(task_id, "bench-run")
        ids.append(task_id)
    return ids


def streams_cpu(stack: Stack, changer: Changer, watchers: int) -> dict[str, float]:
    """The web's CPU over ``STREAMS_WINDOW`` s of changes with no poll: what the streams cost by themselves
    (a share of one core, and per delivered event), a figure other work on the machine skews little."""
    assert stack.web is not None
    time.sleep(0.5)  # the changer's first round
    cpu0, changes0, started = process_tree_cpu(stack.web.popen.pid), sum(changer.changes.values()), time.monotonic()
    time.sleep(STREAMS_WINDOW)
    cpu = process_tree_cpu(stack.web.popen.pid) - cpu0
    seconds = time.monotonic() - started
    events = (sum(changer.changes.values()) - changes0) * watchers / len(changer.ids)
    return {"web_cpu_share": round(cpu / seconds, 3), "events_per_s": round(events / seconds),
            "web_cpu_us_per_event": round(cpu * 1e6 / events, 1) if events else 0.0}


def one_phase(stack: Stack, store: TaskStore, ids_file: str, watchers: int, conns: int, warmup: float,
              duration: float) -> dict[str, Any]:
    store.redis.delete(keys.streams(MEMBER))  # the previous phase's closed streams: a clean count
    proc = None
    if watchers:
        proc = subprocess.Popen([sys.executable, "-m", "bench.watchers", "--port", str(stack.config.port),
                                 "--ids", ids_file, "--count", str(watchers)], cwd=REPO, env=stack.environ(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        ready = proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            proc.kill()
            raise RuntimeError(f"bench.watchers did not get ready: {ready}")
    ids = open(ids_file).read().split()
    changer = Changer(store, ids)
    assert stack.web is not None
    changer.start()
    streams_only = streams_cpu(stack, changer, watchers)
    web_cpu = process_tree_cpu(stack.web.popen.pid)
    try:
        polls = loadgen(stack.config.port, "status", conns=conns, warmup=warmup, duration=duration,
                        ids_file=ids_file, env=stack.environ())
    finally:
        changes = changer.stop()
    # gunicorn's CPU per poll served (warm-up included), streams' work included: unlike req/s, other
    # work on a shared machine does not skew it
    polls["web_cpu_ms_per_poll"] = round(
        (process_tree_cpu(stack.web.popen.pid) - web_cpu) * 1000 / max(int(polls["submitted_total"]), 1), 3)
    result: dict[str, Any] = {"watchers": watchers, "polls": polls, "changes": sum(changes.values()),
                              "streams_only": streams_only}
    if proc is not None:
        time.sleep(GRACE)  # the delivery window of the last changes (part of the measurement's definition)
        out, _ = proc.communicate("stop\n", timeout=60)
        seen = json.loads(out.strip().splitlines()[-1])
        per_task = Counter(ids[n % len(ids)] for n in range(watchers))
        expected = sum(per_task[t] * changes[t] for t in per_task)
        seen["expected_events"] = expected
        seen["missed"] = max(0, expected - int(seen["events"]))
        # missed but not coalesced into a later event (an id the stream jumped over): lost outright
        seen["lost"] = max(0, seen["missed"] - int(seen["coalesced"]))
        del seen["events_per_task"]
        result["stream"] = seen
    return result


def watchers_phase(stack: Stack, conns: int, warmup: float, duration: float, rounds: int,
                   counts: tuple[int, ...] = COUNTS) -> dict[str, Any]:
    """gthread (``counts[0]`` watchers) and gevent (each of ``counts``) alternately, ``rounds`` times, a fresh
    web for each; the best round of each (model, count) counts, as in the HTTP phases."""
    if stack.web is not None:
        stack.stop(stack.web)
    found: dict[str, dict[str, list[dict[str, Any]]]] = {"gthread": {}, "gevent": {}}
    starts = 0
    for r in range(rounds):
        for model in found:
            web = stack.start_web(replace(stack.config, web_worker_class=model))
            store = TaskStore(connect(stack.config), stack.config)
            try:
                ids_file = stack.dir / f"watch-ids-{starts}.txt"
                ids_file.write_text("\n".join(create_tasks(stack, store, base=starts * TASKS)))
                starts += 1
                # gevent's counts ascending in even rounds, descending in odd ones: a machine getting busier
                # or quieter during a run does not always favour the same count
                order = counts if r % 2 == 0 else counts[::-1]
                for n in order if model == "gevent" else counts[:1]:
                    found[model].setdefault(str(n), []).append(
                        one_phase(stack, store, str(ids_file), n, conns, warmup, duration))
            finally:
                store.redis.close()
                stack.stop(web)
    out: dict[str, Any] = {"threads": stack.config.web_threads}
    for model, by_count in found.items():
        out[model] = {}
        for count, results in by_count.items():
            top: dict[str, Any] = dict(max(results, key=lambda e: float(e["polls"]["rps"])))
            top["rounds_rps"] = [e["polls"]["rps"] for e in results]
            out[model][count] = top
    return out
