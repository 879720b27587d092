"""The Python client's and the CLI's side of read tokens, a task's output and its place in line (issues 30, 31),
against a scripted transport (httpx.MockTransport). The real stack: tests/integration/test_token_clients.py."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from rich.console import Console

from taskport import Client, TaskExpired, render
from tests.unit.test_client import TID, IterStream, Script, doc

Answer = Callable[[httpx.Request], httpx.Response]
TOKEN = {"token": "tpr.abc.def", "expires_at": "2026-12-07T09:00:00.000Z"}


def line(n: int) -> dict[str, Any]:
    return {"id": f"1-{n}", "at": "2026-12-07T08:00:00.000Z", "text": f"line {n}"}


def stream(*events: tuple[str, str, dict[str, Any]], broken: bool = False) -> Answer:
    """An event stream of ``(event, id, data)``, cut after them when ``broken``."""
    def answer(request: httpx.Request) -> httpx.Response:
        def body() -> Iterator[bytes]:
            for name, seq, data in events:
                yield f"event: {name}\nid: {seq}\ndata: {json.dumps(data)}\n\n".encode()
            if broken:
                raise httpx.RemoteProtocolError("peer closed connection")

        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=IterStream(body()))

    return answer


def page(lines: list[dict[str, Any]], next_id: str | None) -> httpx.Response:
    return httpx.Response(200, json={"lines": lines, "next": next_id})


@pytest.fixture
def naps() -> list[float]:
    return []


def client(script: Script, naps: list[float], **kwargs: Any) -> Client:
    return Client("http://tp.test/", kwargs.pop("api_key", "k1"), transport=httpx.MockTransport(script),
                  sleep=naps.append, **kwargs)


def test_read_tokens_are_minted_with_the_key_and_a_token_client_sends_only_the_token(naps: list[float]) -> None:
    script = Script(httpx.Response(201, json=TOKEN), httpx.Response(201, json=TOKEN),
                    httpx.Response(201, json=TOKEN), httpx.Response(202, json=doc("PENDING", 0, read_token=TOKEN)))
    with client(script, naps) as c:
        assert c.read_token(TID) == TOKEN
        assert c.read_token(TID, ttl=60) == TOKEN
        assert c.batch_read_token("b/1", ttl=5) == TOKEN
        assert c.submit("demo.sleep", {"output": True}, read_token=True)["read_token"] == TOKEN
    first, second, batch, submit = script.requests
    assert (first.method, first.url.path, first.content) == ("POST", f"/api/v1/tasks/{TID}/tokens", b"")
    assert json.loads(second.content) == {"ttl": 60} and second.headers["Authorization"] == "Bearer k1"
    assert batch.url.raw_path == b"/api/v1/batches/b%2F1/tokens" and json.loads(batch.content) == {"ttl": 5}
    assert json.loads(submit.content) == {"type": "demo.sleep", "payload": {"output": True}, "read_token": True}

    reads = Script(httpx.Response(200, json=doc()))
    with client(reads, naps, api_key="k1", token=TOKEN["token"]) as reader:
        reader.status(TID)
    assert reads.requests[0].headers["Authorization"] == f"Bearer {TOKEN['token']}"


def test_a_token_for_an_expired_task_is_task_expired_and_a_refused_one_a_problem(naps: list[float]) -> None:
    expired = doc("EXPIRED", 0)
    script = Script(httpx.Response(410, json=expired),
                    httpx.Response(403, json={"title": "Forbidden", "status": 403, "detail": "a read token"}))
    with client(script, naps) as c:
        with pytest.raises(TaskExpired):
            c.read_token(TID)
        with pytest.raises(Exception, match="403") as refused:
            c.read_token(TID)
    assert getattr(refused.value, "status", None) == 403


def test_output_reads_one_page_after_a_cursor(naps: list[float]) -> None:
    script = Script(page([line(1), line(2)], "1-2"), page([], None))
    with client(script, naps) as c:
        assert c.output(TID)["lines"] == [line(1), line(2)]
        assert c.output(TID, "1-2", limit=10) == {"lines": [], "next": None}
    assert script.requests[0].url.params.get("after") is None
    assert dict(script.requests[1].url.params) == {"after": "1-2", "limit": "10"}


def test_follow_hands_on_stream_output_once_in_order_and_reads_the_rest_at_the_end(naps: list[float]) -> None:
    """Output events interleave with status ones (one id resumes both); a drop resumes with the last id, whatever
    its event; the lines the stream did not bring before the terminal document are read from /output."""
    script = Script(
        stream(("status", "3", doc("PROCESSING", 0)), ("output", "3.1", line(1)), ("output", "3.2", line(2)),
               broken=True),
        stream(("output", "3.2", line(2)), ("status", "4.2", doc("PROCESSING", 50)),
               ("status", "5.2", doc("COMPLETED", 100))),
        page([line(3)], "1-3"), page([], None))
    got: list[str] = []
    with client(script, naps) as c:
        docs = list(c.follow(TID, on_output=lambda out: got.append(out["text"])))
    assert [d["progress"] for d in docs] == [0, 50, 100]
    assert got == ["line 1", "line 2", "line 3"]  # line 2 sent again on the resume is handed on once
    assert script.requests[1].headers["Last-Event-ID"] == "3.2"
    assert [dict(r.url.params) for r in script.requests[2:]] == [{"after": "1-2"}, {"after": "1-3"}]


def test_without_on_output_the_stream_and_the_requests_are_as_before(naps: list[float]) -> None:
    script = Script(stream(("output", "3.1", line(1)), ("status", "4", doc("COMPLETED", 100))))
    with client(script, naps) as c:
        assert [d["status"] for d in c.follow(TID)] == ["COMPLETED"]
        assert len(script.requests) == 1
    events = Script(stream(("status", "3", doc()), ("output", "3.1", line(1)), ("status", "4", doc("COMPLETED", 100))))
    with client(events, naps) as c:
        assert [(e.event, e.id) for e in c.events(TID, output=True)] == [("status", 3), ("output", "3.1"),
                                                                         ("status", 4)]


def test_polling_reads_output_after_each_status_read_and_a_failed_page_decides_nothing(naps: list[float]) -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    script = Script(
        *([refused] * 4),  # the stream cannot be opened (3 reconnects): polling
        httpx.Response(200, json=doc("PROCESSING", 10), headers={"Retry-After": "1"}), page([line(1)], "1-1"),
        httpx.Response(200, json=doc("PROCESSING", 60), headers={"Retry-After": "1"}),
        httpx.Response(503, json={"title": "Unavailable", "status": 503}),  # this page is left to the next poll
        httpx.Response(200, json=doc("COMPLETED", 100)), page([line(2), line(3)], "1-3"), page([], None),
        httpx.Response(200, json={"result": {}, "items": None, "failures": [], "error_code": None}))
    got: list[str] = []
    with client(script, naps) as c:
        c.wait(TID, sse=True, on_output=lambda out: got.append(out["text"]))
    assert got == ["line 1", "line 2", "line 3"]
    outputs = [dict(r.url.params) for r in script.requests if r.url.path.endswith("/output")]
    assert outputs == [{}, {"after": "1-1"}, {"after": "1-1"}, {"after": "1-3"}]


def test_an_expired_task_reads_no_output(naps: list[float]) -> None:
    script = Script(stream(("status", "9", doc("EXPIRED", 0))))
    with client(script, naps) as c:
        assert [d["status"] for d in c.follow(TID, on_output=lambda out: None)] == ["EXPIRED"]
    assert len(script.requests) == 1


def queued(position: int, start: str | None) -> dict[str, Any]:
    return doc("PENDING", 0, queue={"position": position, "estimated_start": start})


def test_the_place_in_line_in_local_time_and_only_while_queued() -> None:
    start = "2026-12-07T12:01:05.000Z"
    local = datetime(2026, 12, 7, 12, 1, 5, tzinfo=UTC).astimezone().strftime("%H:%M:%S")
    assert render.queued(queued(3, start)) == f"queued: 3 ahead, starts ~{local}"
    assert render.queued(queued(0, None)) == "queued: next"
    assert render.queued(doc("PROCESSING", 5, queue={"position": 2, "estimated_start": None})) == ""
    assert render.queued(doc("PENDING", 0)) == ""
    console = Console(record=True, width=200)
    render.status(queued(12, None), console)
    assert "queue     12 ahead" in console.export_text().splitlines()


def test_the_bar_says_the_place_in_line_then_the_message() -> None:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=False)
    render.progress(iter([queued(2, None)]), console)
    assert "queued: 2 ahead" in out.getvalue()
    out = io.StringIO()
    render.progress(iter([queued(2, None), doc("PROCESSING", 40, message="step 4 of 10")]),
                    Console(file=out, width=160, force_terminal=False))
    assert "step 4 of 10" in out.getvalue() and "queued" not in out.getvalue()


def test_the_cli_prints_the_output_lines_with_the_bar_and_not_with_json(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from taskport import cli

    def answers(output: bool) -> Script:
        return Script(
            stream(("status", "1", doc("PROCESSING", 0)), ("output", "1.1", line(1)), ("output", "1.2",
                   {**line(2), "text": "[bold]not markup[/bold] :smile:"}), ("status", "2.2", doc("COMPLETED", 100))),
            *([page([], None)] if output else []),
            httpx.Response(200, json={"status": "COMPLETED", "task_id": TID, "result": {"ok": 1}, "items": None,
                                      "failures": [], "error_code": None}))

    scripts: list[Script] = []

    def fake_client(url: str | None = None, api_key: str | None = None, **kw: Any) -> Client:
        scripts.append(answers(output=not scripts))
        return Client("http://tp.test", api_key, transport=httpx.MockTransport(scripts[-1]))

    monkeypatch.setattr("taskport.client.Client", fake_client)
    assert cli.main(["watch", TID]) == cli.OK
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[:2] == ["line 1", "[bold]not markup[/bold] :smile:"]  # as written, before the bar's last state
    assert "COMPLETED" in lines[-1] and "100%" in lines[-1]
    assert cli.main(["watch", TID, "--json"]) == cli.OK
    captured = capsys.readouterr()
    assert "line 1" not in captured.err + captured.out and json.loads(captured.out)["result"] == {"ok": 1}
    assert all(not r.url.path.endswith("/output") for r in scripts[-1].requests)
