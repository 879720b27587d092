"""``taskport batch ...`` (issue 21): the parser, the requests each command sends, its output and exit code, against
a scripted transport. The batch calls themselves: taskport/batches.py (tests/unit/test_client.py)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from taskport import Client, batches_cli, cli, render

BID = "7d0c1f52-6b1e-4f7a-9a43-2b6e0c9d1a10"
THEN = "0b6f0d1e-1f0e-4a55-8d2c-5e2f3a9c7b11"


def batch(status: str = "DONE", **counts: int) -> dict[str, Any]:
    every = {"PENDING": 0, "PROCESSING": 0, "COMPLETED": 0, "FAILED": 0, "CANCELLED": 0, "EXPIRED": 0}
    every.update(counts or ({"COMPLETED": 3} if status == "DONE" else {"PENDING": 3}))
    return {"batch_id": BID, "size": sum(every.values()), "status": status, "counts": every,
            "progress": 100 if status == "DONE" else 0, "items": {"total": 0, "succeeded": 0, "failed": 0},
            "then_task_id": THEN, "created_at": "2026-12-02T01:05:39.316Z",
            "completed_at": "2026-12-02T01:05:41.002Z" if status == "DONE" else None,
            "expires_at": "2026-12-03T01:05:41.002Z", "callback": None, "links": {"self": f"/api/v1/batches/{BID}"}}


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


BODY = {"tasks": [{"type": "demo.sleep", "payload": {"seconds": 0}}] * 3, "then": {"type": "demo.sleep"}}


def test_submit_sends_the_file_as_the_body_and_prints_the_id(monkeypatch, capsys, tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({**BODY, "callback": {"url": "https://a.example/"}}))
    entries = [{"task_id": f"t{i}", "status": "PENDING", "duplicate": i == 2} for i in range(3)]
    code, sent = run(monkeypatch, ["batch", "submit", str(path)],
                     httpx.Response(202, json={**batch("RUNNING"), "tasks": entries}))
    out = capsys.readouterr()
    assert (code, out.out) == (cli.OK, BID + "\n")
    assert out.err.strip() == f"submitted batch {BID}: 3 tasks (1 already submitted: that task counted), then {THEN}"
    assert (sent[0].method, sent[0].url.path) == ("POST", "/api/v1/batches")
    assert json.loads(sent[0].content) == {**BODY, "callback": {"url": "https://a.example/"}}


def test_submit_reads_stdin_and_the_callback_options_replace_the_files(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({**BODY, "callback": {"url": "https://old.example/"}})))
    code, sent = run(monkeypatch, ["batch", "submit", "-", "--json", "--callback-url", "https://new.example/"],
                     httpx.Response(202, json={**batch("RUNNING"), "tasks": []}))
    assert code == cli.OK and json.loads(capsys.readouterr().out)["batch_id"] == BID
    assert json.loads(sent[0].content)["callback"] == {"url": "https://new.example/"}


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "is not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"tasks": {}}', '"tasks" must be a list'),
    ('{"tasks": [], "than": {}}', "unknown field 'than'"),
])
def test_a_bad_file_is_a_usage_error_before_any_request(monkeypatch, capsys, tmp_path: Path, text: str,
                                                        message: str) -> None:
    path = tmp_path / "batch.json"
    path.write_text(text)
    code, sent = run(monkeypatch, ["batch", "submit", str(path)])
    assert (code, sent) == (cli.USAGE, [])
    assert message in capsys.readouterr().err
    code, sent = run(monkeypatch, ["batch", "submit", str(tmp_path / "missing.json")])
    assert (code, sent) == (cli.USAGE, []) and "cannot read" in capsys.readouterr().err


def test_a_refused_batch_is_exit_2_naming_the_task_and_the_cap_exit_1(monkeypatch, capsys, tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(BODY))
    bad = {"type": "/problems/validation", "title": "Request failed validation", "status": 422,
           "errors": {"tasks.1.payload.seconds": ["Not a valid number."]}}
    code, _ = run(monkeypatch, ["batch", "submit", str(path)], httpx.Response(422, json=bad))
    assert code == cli.USAGE and "tasks.1.payload.seconds: Not a valid number." in capsys.readouterr().err
    cap = {"type": "/problems/too-many-active", "title": "Too many active tasks", "status": 429}
    code, _ = run(monkeypatch, ["batch", "submit", str(path)], httpx.Response(429, json=cap))
    assert code == cli.ERROR and "429 Too many active tasks" in capsys.readouterr().err


def test_a_batch_callback_takes_no_events(monkeypatch, capsys, tmp_path: Path) -> None:
    """A batch's callback is sent once, when it is DONE: the option is not offered (the API refuses events)."""
    with pytest.raises(SystemExit):
        run(monkeypatch, ["batch", "submit", "-", "--callback-url", "https://a.example/", "--callback-event", "FAILED"])
    assert "unrecognized arguments: --callback-event" in capsys.readouterr().err


@pytest.mark.parametrize(("document", "code"), [
    (batch("RUNNING"), cli.STILL_RUNNING),
    (batch(), cli.OK),
    ({**batch(), "items": {"total": 4, "succeeded": 3, "failed": 1}}, cli.PARTIAL),
    (batch(COMPLETED=1, CANCELLED=1, FAILED=1), cli.FAILED),
    (batch(COMPLETED=1, CANCELLED=1, EXPIRED=1), cli.EXPIRED),
    (batch(COMPLETED=2, CANCELLED=1), cli.CANCELLED),
])
def test_status_prints_the_document_and_exits_as_its_worst_task(monkeypatch, capsys, document, code) -> None:
    assert run(monkeypatch, ["batch", "status", BID], httpx.Response(200, json=document))[0] == code
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"batch     {BID}" and lines[1] == f"status    {document['status']}"
    assert f"then      {THEN}" in lines


def test_status_shows_the_counts_items_and_callback_leaving_empty_fields_out() -> None:
    console = Console(width=200, record=True)
    render.batch({**batch(COMPLETED=18, FAILED=1, CANCELLED=1), "items": {"total": 40, "succeeded": 39, "failed": 1},
                  "callback": {"state": "delivered", "attempts": 3, "last_status": 204}, "then_task_id": None}, console)
    text = console.export_text()
    assert "tasks     18 completed, 1 failed, 1 cancelled of 20" in text
    assert "items     39 ok, 1 failed of 40" in text
    assert "callback  delivered after 3 attempts (last answer 204)" in text
    assert "then" not in text


def test_tasks_pages_with_the_status_filter_up_to_the_limit(monkeypatch, capsys) -> None:
    def task(n: int) -> dict[str, Any]:
        return {"task_id": f"t{n}", "type": "demo.sleep", "status": "FAILED", "progress": 100, "items": None}

    pages = (httpx.Response(200, json={"tasks": [task(1), task(2)], "next_cursor": "c1"}),
             httpx.Response(200, json={"tasks": [task(3)], "next_cursor": "c2"}))
    code, sent = run(monkeypatch, ["batch", "tasks", BID, "--status", "failed", "--limit", "3", "--json"], *pages)
    assert code == cli.OK and [d["task_id"] for d in json.loads(capsys.readouterr().out)] == ["t1", "t2", "t3"]
    assert [(r.url.path, r.url.params.get("status"), r.url.params.get("cursor")) for r in sent] == [
        (f"/api/v1/batches/{BID}/tasks", "FAILED", None), (f"/api/v1/batches/{BID}/tasks", "FAILED", "c1")]


def test_watch_follows_the_stream_to_done_and_cancel_sends_delete(monkeypatch, capsys) -> None:
    events = "".join(f"event: batch\nid: {n}\ndata: {json.dumps(d)}\n\n"
                     for n, d in ((1, batch("RUNNING")), (2, batch(COMPLETED=2, FAILED=1))))
    stream = httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=events.encode())
    code, sent = run(monkeypatch, ["batch", "watch", BID], stream)
    out = capsys.readouterr()
    assert code == cli.FAILED and sent[0].url.path == f"/api/v1/batches/{BID}/events"
    assert "tasks     2 completed, 1 failed of 3" in out.out and "DONE" in out.err  # the bar on stderr
    code, sent = run(monkeypatch, ["batch", "cancel", BID], httpx.Response(204))
    assert (code, sent[0].method, capsys.readouterr().out) == (cli.OK, "DELETE", f"cancelled batch {BID}\n")


def test_callback_of_builds_the_submit_callback() -> None:
    parser = argparse.ArgumentParser()
    batches_cli.add_callback_options(parser)
    assert batches_cli.callback_of(parser.parse_args([])) is None
    args = parser.parse_args(["--callback-url", "https://a.example/", "--callback-event", "completed"])
    assert batches_cli.callback_of(args) == {"url": "https://a.example/", "events": ["COMPLETED"]}
    with pytest.raises(SystemExit):
        parser.parse_args(["--callback-url", "https://a.example/", "--callback-event", "RUNNING"])
    with pytest.raises(cli.UsageError, match="--callback-event needs --callback-url"):
        batches_cli.callback_of(parser.parse_args(["--callback-event", "FAILED"]))
