"""The job claim against a real redis-server (issue 29, finding 6: docs/self-healing.md, "Known window").

A TCP proxy sits between the worker and Redis and loses the answer to the worker's take: Redis ran the
command, the connection is reset before the answer reaches the worker (a Redis that died after writing
it, a network blip). With RQ's pop the id was then out of its queue and nowhere else, and the task stayed
PENDING for good; with the claim the id waits on the worker's claim list, and the take sent again (redis-py's
retry) puts it back first. And the workers stay RQ workers: ``rq info`` (Worker.all) lists them on their
queues.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from rq import Worker

from app.core import keys
from app.core.config import Config
from app.core.connection import connect
from app.core.process import free_port
from app.core.states import QUEUES
from tests.integration.harness import RedisServer, Stack, wait_until
from tests.integration.in_process import in_process_client, in_process_config  # noqa: F401 - fixtures
from workers.worker import StoppableSimpleWorker

CHUNK = 65536


class AnswerLosingProxy:
    """Forwards TCP to Redis's unix socket; the first answer holding ``needle`` is not delivered: both sides of that
    connection are reset instead (the command ran in Redis)."""

    def __init__(self, upstream: Path) -> None:
        self.upstream = upstream  # the server's unix socket
        self.port = free_port()
        self.needle: bytes | None = None
        self.lost = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(str(self.upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(CHUNK):
                if answers and self.needle is not None and self.needle in data:
                    self.needle, self.lost = None, self.lost + 1
                    break  # the answer is dropped, and the connection with it
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # shutdown first: it wakes the thread reading the other way
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[AnswerLosingProxy]:
    p = AnswerLosingProxy(redis_server.socket)
    yield p
    p.close()


def test_a_take_whose_answer_is_lost_does_not_lose_the_job(client, config, proxy, redis_conn):
    r = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}})
    assert r.status_code == 202
    task_id = r.get_json()["task_id"]
    proxy.needle = task_id.encode()  # the worker's take answers with the job id: that answer is lost
    via_proxy = Config.from_env({}, redis_url=f"redis://127.0.0.1:{proxy.port}/0", data_dir=config.data_dir,
                                api_keys="")
    worker_conn = connect(via_proxy, ride_out=True)  # a worker's client: a lost answer is a command sent again
    StoppableSimpleWorker(list(QUEUES), connection=worker_conn).work(burst=True, logging_level="WARNING")
    assert proxy.lost == 1
    # before the claim (RQ's pop): the id was gone with the answer, the task PENDING with no job anywhere
    assert client.get(f"/api/v1/tasks/{task_id}").get_json()["status"] == "COMPLETED"
    assert not any(redis_conn.llen(keys.job_claims(w.decode())) for w in redis_conn.smembers(keys.JOB_CLAIMANTS))


def test_a_stop_that_lands_inside_a_take_runs_the_job_taken_and_then_stops(client, redis_conn, monkeypatch):
    """SIGTERM between the claim and the job's start (here: inside the take's log line, where make test once saw it
    land). RQ raised StopRequested into whatever ran there; inside a log call logging swallowed it with a
    traceback and the worker, its job run, then waited on forever (SIGKILLed by its supervisor); outside one, the
    worker left with the job on its claim list. Now a stop there is a flag: the job taken runs, then RQ's loop
    ends (a warm stop), with nothing left claimed."""
    r = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}})
    task_id = r.get_json()["task_id"]
    worker = StoppableSimpleWorker(list(QUEUES), connection=redis_conn)
    real_info = worker.log.info

    def info(msg: str, *args: object, **kwargs: object) -> None:
        if msg == "Worker %s: %s: %s" and task_id in args:  # the take's line: the job is claimed, not started
            os.kill(os.getpid(), signal.SIGTERM)
        real_info(msg, *args, **kwargs)

    monkeypatch.setattr(worker.log, "info", info)
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        worker.work(burst=False, logging_level="WARNING")  # returns only once the stop has ended the worker
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert client.get(f"/api/v1/tasks/{task_id}").get_json()["status"] == "COMPLETED"
    assert not redis_conn.llen(keys.job_claims(worker.name))


def test_workers_stay_rq_workers_listed_on_their_queues_and_take_jobs_when_woken(
        stack: Stack, redis_conn: redis.Redis) -> None:
    stack.start_web()
    stack.start_worker(2)
    workers = wait_until(lambda: len(Worker.all(connection=redis_conn)) == 2 and Worker.all(connection=redis_conn),
                         timeout=30, message="two RQ workers registered")
    assert all(w.queue_names() == list(QUEUES) for w in workers)
    r = requests.post(stack.url("/api/v1/tasks"), json={"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}},
                      timeout=10)
    assert r.status_code == 202
    task = r.json()["task_id"]
    wait_until(lambda: requests.get(stack.url(f"/api/v1/tasks/{task}"), timeout=10).json()["status"] == "COMPLETED",
               timeout=30, message="the task completed")
