"""The client side of run_at / delay / after (issue 20): the Python client's body, the CLI's flags."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

import httpx
import pytest

from taskport import Client
from taskport.cli import add_commands


def test_the_python_client_sends_run_at_delay_and_after() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(202, json={"task_id": "x", "status": "PENDING"})

    with Client("http://tp.test", transport=httpx.MockTransport(answer)) as c:
        c.submit("demo.sleep", run_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), after=("a", "b"))
        c.submit("demo.sleep", delay=2.5)
        c.submit("demo.sleep")
    bodies = [json.loads(r.content) for r in sent]
    assert bodies[0] == {"type": "demo.sleep", "payload": {}, "run_at": "2030-01-02T03:04:05+00:00",
                         "after": ["a", "b"]}
    assert bodies[1] == {"type": "demo.sleep", "payload": {}, "delay": 2.5}
    assert bodies[2] == {"type": "demo.sleep", "payload": {}}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_commands(p.add_subparsers())
    return p


def test_the_cli_takes_delay_or_run_at_and_repeated_after() -> None:
    args = parser().parse_args(["submit", "demo.sleep", "--delay", "3", "--after", "a", "--after", "b"])
    assert (args.delay, args.run_at, args.after) == (3.0, None, ["a", "b"])
    args = parser().parse_args(["submit", "demo.sleep", "--run-at", "2030-01-01T00:00:00Z"])
    assert (args.delay, args.run_at, args.after) == (None, "2030-01-01T00:00:00Z", None)
    with pytest.raises(SystemExit):
        parser().parse_args(["submit", "demo.sleep", "--delay", "3", "--run-at", "2030-01-01T00:00:00Z"])
