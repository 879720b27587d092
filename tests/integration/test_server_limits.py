"""gunicorn's own answers (before the app: an over-long request line, too large headers) are problem+json
like every other error of the service, with no echo of the client's bytes."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.integration.harness import Stack, started_stack


@pytest.fixture(scope="module", params=["gevent", "gthread"])
def stack(tmp_path_factory, request) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("server-limits"), worker=False, web_worker_class=request.param) as s:
        yield s


def raw_request(stack: Stack, head: str) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", stack.config.port), timeout=10) as sock:
        sock.sendall(head.encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(("head", "status"), [
    (f"GET /api/v1/tasks?x={'a' * 5000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414),
    ("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + "b" * 9000 + "\r\n\r\n", 431),
    ("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"X-{n}: 1\r\n" for n in range(120)) + "\r\n", 431),
])
def test_gunicorns_own_answers_are_problem_json(stack: Stack, head: str, status: int) -> None:
    got, headers, body = raw_request(stack, head)
    assert got == status
    assert headers["content-type"] == "application/problem+json"
    problem = orjson.loads(body)
    assert problem["status"] == status and problem["detail"]
    assert b"aaaa" not in body and b"bbbb" not in body
