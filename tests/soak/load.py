"""The soak's steady load over HTTP, and its ledger: everything the service acknowledged.

Each op is one of: an itemized ``demo.sleep`` (items that take time, so checkpoints happen under the faults),
an ``orders.split`` (its result lists every item: a lost or doubled item shows), an ``orders.export`` CSV (a
file whose bytes follow from its payload), or a batch of ``demo.sleep`` tasks with a ``batch.summary``
``then`` task and a callback. A third of the single tasks ask for a callback too.

A request is sent again, with the same key (``Idempotency-Key`` for a submit, the tasks' ``dedup_key`` in a
batch), while the answer is a connection error, a timeout or a 5xx: what any careful client does. A 202 is an
acknowledgement; so is a 409 DUPLICATE to a request sent again after an attempt that may have reached the web
(the earlier attempt created the task). A 409 to a request no earlier attempt could have created is the
product's anomaly, recorded (and its task followed like an acknowledged one).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

EXPORT_ROWS = (1500, 4000, 9000)  # the schedule's export has its own row count (test_soak.SCHEDULE_ROWS)
RETRY_FOR = 60.0  # seconds one request is sent again before the op is given up (counted, never judged)
TIMEOUT = 5.0  # per HTTP attempt


@dataclass
class Acked:
    """One acknowledged task: what was asked, so the checker knows what it must have become."""

    task_id: str
    type: str
    payload: dict[str, Any]
    callback: bool = False
    batch: str | None = None  # the batch it belongs to
    then_of: str | None = None  # the batch whose `then` task it is
    how: str = "202"  # "202", or "409 after a retry" (an earlier attempt created it)


@dataclass
class Ledger:
    tasks: dict[str, Acked] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch id -> {"tasks", "then", "callback"}
    anomalies: list[str] = field(default_factory=list)  # answers the API contract does not allow
    given_up: int = 0  # ops never acknowledged within RETRY_FOR (not judged: the client gave up)
    answers: dict[str, int] = field(default_factory=dict)  # status code (or exception name) -> count
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, what: str) -> None:
        with self.lock:
            self.answers[what] = self.answers.get(what, 0) + 1


class Load:
    """One thread sending an op every ``interval`` s (jittered) to ``base_url`` until ``stop()``; given several
    (the multi-host bed's web hosts), a request that gets no answer is sent again to the next one, as a load
    balancer would."""

    def __init__(self, base_url: str | Sequence[str], callback_url: str, seed: int, interval: float) -> None:
        self.urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.base_url = self.urls[0]
        self.callback_url = callback_url
        self.interval = interval
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.session = requests.Session()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.ops = 0

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(RETRY_FOR + TIMEOUT + 5)

    def _run(self) -> None:
        ops = (self.itemized, self.split, self.export, self.batch)
        while not self._stop.wait(self.interval * self.rng.uniform(0.5, 1.5)):
            self.rng.choices(ops, weights=(35, 20, 20, 25))[0]()
            self.ops += 1

    # -- the ops -----------------------------------------------------------------------------------
    def _callback(self, kind: str) -> dict[str, str]:
        return {"url": f"{self.callback_url}/{kind}"}

    def itemized(self) -> None:
        payload = {"seconds": 0, "steps": 1, "items": self.rng.randint(5, 30), "item_seconds": 0.05}
        self.single("demo.sleep", payload)

    def split(self) -> None:
        count = self.rng.randint(3, 40)
        tag = uuid.uuid4().hex[:8]
        items = [{"item_code": f"{tag}-{i}", "quantity": 1 + i % 3, "warehouse": f"wh{i % 4}"} for i in range(count)]
        self.single("orders.split", {"order_code": f"SOAK-{tag}", "items": items})

    def export(self) -> None:
        self.single("orders.export", {"rows": self.rng.choice(EXPORT_ROWS), "format": "csv"})

    def single(self, type_: str, payload: dict[str, Any]) -> None:
        body: dict[str, Any] = {"type": type_, "payload": payload}
        callback = self.rng.random() < 1 / 3
        if callback:
            body["callback"] = self._callback("task")
        key = uuid.uuid4().hex
        answer = self._send("/api/v1/tasks", body, {"Idempotency-Key": key})
        if answer is None:
            return
        doc, how = answer
        with self.ledger.lock:
            self.ledger.tasks[doc["task_id"]] = Acked(doc["task_id"], type_, payload, callback, how=how)

    def batch(self) -> None:
        tag = uuid.uuid4().hex
        tasks: list[dict[str, Any]] = [
            {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1, "items": self.rng.randint(3, 12),
                                               "item_seconds": 0.05}, "dedup_key": f"{tag}-{i}"}
            for i in range(self.rng.randint(2, 4))]
        then: dict[str, Any] = {"type": "batch.summary", "payload": {}}
        if self.rng.random() < 0.5:
            then["callback"] = self._callback("then")
        body = {"tasks": tasks, "then": then, "callback": self._callback("batch")}
        answer = self._send("/api/v1/batches", body, {})
        if answer is None:
            return
        doc, how = answer
        batch_id, members = doc["batch_id"], [t["task_id"] for t in doc["tasks"]]
        with self.ledger.lock:
            for spec, task_id in zip(tasks, members, strict=True):
                self.ledger.tasks[task_id] = Acked(task_id, "demo.sleep", spec["payload"], batch=batch_id, how=how)
            then_id = doc["then_task_id"]
            self.ledger.tasks[then_id] = Acked(then_id, "batch.summary", {}, "callback" in then, then_of=batch_id,
                                               how=how)
            self.ledger.batches[batch_id] = {"tasks": members, "then": then_id, "callback": True}

    # -- sending -----------------------------------------------------------------------------------
    def _send(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any], str] | None:
        """POST until acknowledged: (the document, how it was acknowledged), or None once given up."""
        deadline = time.monotonic() + RETRY_FOR
        maybe_sent = False  # an earlier attempt may have reached the web (and created what this one finds)
        while time.monotonic() < deadline and not (self._stop.is_set() and not maybe_sent):
            try:
                response = self.session.post(self.base_url + path, json=body, headers=headers, timeout=TIMEOUT)
            except requests.RequestException as exc:
                self.ledger.note(type(exc).__name__)
                maybe_sent = maybe_sent or "refused" not in str(exc)
                self.base_url = self.urls[(self.urls.index(self.base_url) + 1) % len(self.urls)]
                time.sleep(0.5)
                continue
            status = response.status_code
            self.ledger.note(str(status))
            if status == 202:
                return response.json(), "202" if not maybe_sent else "202 after a retry"
            if status == 409 and response.json().get("duplicate") and path.endswith("/tasks"):
                doc = response.json()["existing"]
                if not maybe_sent:
                    self.ledger.anomalies.append(
                        f"POST {path} answered 409 DUPLICATE to its first sending, naming {doc['task_id']}")
                return doc, "409 after a retry"
            if status >= 500 or status == 429:
                if status != 503:
                    self.ledger.anomalies.append(f"POST {path} answered {status}: {response.text[:200]}")
                maybe_sent = True
                time.sleep(min(float(response.headers.get("Retry-After", 1) or 1), 1.0))
                continue
            self.ledger.anomalies.append(f"POST {path} answered {status}: {response.text[:300]}")
            return None
        with self.ledger.lock:
            self.ledger.given_up += 1
        return None
