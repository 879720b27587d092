"""``taskport schedules ...`` (issue 20): the parser, the requests each command sends, its output and exit code,
against a scripted transport. The schedule calls themselves: taskport/schedules.py."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import pytest
from rich.console import Console

from taskport import Client, cli, schedules_cli

SID = "4bd659fb-a01d-4040-91a1-8dd150042a87"


def schedule(**extra: Any) -> dict[str, Any]:
    return {"schedule_id": SID, "name": "export", "cron": "*/15 * * * *", "timezone": "Europe/Paris",
            "task": {"type": "orders.export", "payload": {"rows": 100}}, "paused": False,
            "next_run_at": "2026-12-02T01:15:00.000Z", "last_run_at": None, "last_task_id": None,
            "created_at": "2026-12-02T01:05:39.316Z", "links": {"self": f"/api/v1/schedules/{SID}"}, **extra}


def run(monkeypatch: pytest.MonkeyPatch, argv: list[str], *answers: httpx.Response) -> tuple[int, list[httpx.Request]]:
    """Parse ``argv`` as the ``taskport`` parser does and run it on a client answering ``answers`` in turn."""
    sent: list[httpx.Request] = []
    queue = list(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return queue.pop(0)

    real = Client

    def scripted(url: str | None = None, api_key: str | None = None) -> Client:
        return real("http://tp.test", api_key, transport=httpx.MockTransport(answer))

    monkeypatch.setattr("taskport.client.Client", scripted)
    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.run(args), sent


def test_create_sends_the_schedule_and_prints_its_id(monkeypatch, capsys) -> None:
    code, sent = run(monkeypatch, ["schedules", "create", "--cron", "*/15 * * * *", "--timezone", "Europe/Paris",
                                   "--name", "export", "--paused", "orders.export", '{"rows": 100}'],
                     httpx.Response(201, json=schedule(paused=True)))
    assert (code, capsys.readouterr().out) == (cli.OK, SID + "\n")
    assert (sent[0].method, sent[0].url.path) == ("POST", "/api/v1/schedules")
    assert json.loads(sent[0].content) == {"cron": "*/15 * * * *", "timezone": "Europe/Paris", "name": "export",
                                           "paused": True, "task": {"type": "orders.export", "payload": {"rows": 100}}}


def test_a_payload_that_is_not_an_object_is_a_usage_error_before_any_request(monkeypatch, capsys) -> None:
    code, sent = run(monkeypatch, ["schedules", "create", "--cron", "* * * * *", "demo.sleep", "[1]"])
    assert (code, sent) == (cli.USAGE, [])
    assert "PAYLOAD_JSON must be a JSON object" in capsys.readouterr().err


def test_a_bad_cron_is_exit_2_and_an_unknown_id_exit_1(monkeypatch, capsys) -> None:
    bad = {"type": "/problems/validation", "title": "Request failed validation", "status": 422,
           "detail": "invalid field: cron", "errors": {"cron": ["Not a 5-field cron expression."]}}
    code, _ = run(monkeypatch, ["schedules", "create", "--cron", "61 * * * *", "demo.sleep"],
                  httpx.Response(422, json=bad, headers={"Content-Type": "application/problem+json"}))
    assert code == cli.USAGE and "cron" in capsys.readouterr().err
    missing = {"type": "/problems/not-found", "title": "Not found", "status": 404, "detail": "schedule not found"}
    code, _ = run(monkeypatch, ["schedules", "show", "nope"], httpx.Response(404, json=missing))
    assert code == cli.ERROR and "schedule not found" in capsys.readouterr().err


def test_pause_resume_and_delete_send_their_calls(monkeypatch, capsys) -> None:
    code, sent = run(monkeypatch, ["schedules", "pause", SID], httpx.Response(200, json=schedule(paused=True)))
    assert (code, sent[0].method, json.loads(sent[0].content)) == (cli.OK, "PATCH", {"paused": True})
    assert capsys.readouterr().out == f"paused {SID}\n"
    code, sent = run(monkeypatch, ["schedules", "resume", SID, "--json"], httpx.Response(200, json=schedule()))
    assert (code, json.loads(sent[0].content)) == (cli.OK, {"paused": False})
    assert json.loads(capsys.readouterr().out)["paused"] is False
    code, sent = run(monkeypatch, ["schedules", "delete", SID], httpx.Response(204))
    assert (code, sent[0].method, sent[0].url.path) == (cli.OK, "DELETE", f"/api/v1/schedules/{SID}")
    assert capsys.readouterr().out == f"deleted {SID}\n"


def test_list_follows_the_cursor_up_to_the_limit_and_show_leaves_empty_fields_out(monkeypatch, capsys) -> None:
    pages = (httpx.Response(200, json={"schedules": [schedule()], "next_cursor": "c1"}),
             httpx.Response(200, json={"schedules": [schedule(schedule_id="other")], "next_cursor": None}))
    code, sent = run(monkeypatch, ["schedules", "list", "--json", "--limit", "5"], *pages)
    assert code == cli.OK and [d["schedule_id"] for d in json.loads(capsys.readouterr().out)] == [SID, "other"]
    assert [r.url.params.get("cursor") for r in sent] == [None, "c1"]
    console = Console(width=200, record=True)
    schedules_cli.show(schedule(), console)
    text = console.export_text()
    assert "task       orders.export {\"rows\": 100}" in text and "last run" not in text
