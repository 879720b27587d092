"""app.core.connection.OneSend: a command in one ``send`` where redis-py calls ``sendall``, with redis-py's own
answers to every failure (a fake socket records what the connection asks of it)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import UnixDomainSocketConnection

from app.core.connection import OneSend, send_in_one

COMMAND = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"


class FakeSocket:
    def __init__(self, sends: list[Any]) -> None:
        self.sends = sends  # what each send does: a count of bytes taken, or an exception to raise
        self.calls: list[tuple[str, bytes]] = []
        self.closed = False

    def send(self, data: Any) -> int:
        self.calls.append(("send", bytes(data)))
        what = self.sends.pop(0)
        if isinstance(what, BaseException):
            raise what
        return int(what)

    def sendall(self, data: Any) -> None:
        self.calls.append(("sendall", bytes(data)))
        if self.sends and isinstance(self.sends[0], BaseException):
            raise self.sends.pop(0)

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Connection(OneSend, UnixDomainSocketConnection):
    pass


def connected(sends: list[Any]) -> tuple[Connection, FakeSocket]:
    conn = Connection(path="/nonexistent", health_check_interval=0)
    sock = FakeSocket(sends)
    conn._sock = sock
    return conn, sock


def test_a_command_goes_in_one_send() -> None:
    conn, sock = connected([len(COMMAND)])
    conn.send_packed_command([COMMAND])
    assert sock.calls == [("send", COMMAND)]


def test_what_a_send_leaves_goes_through_redis_pys_sendall() -> None:
    conn, sock = connected([5])
    conn.send_packed_command([COMMAND])
    assert sock.calls == [("send", COMMAND), ("sendall", COMMAND[5:])]


def test_a_command_in_several_strings_is_redis_pys_sendall_each() -> None:
    conn, sock = connected([])
    conn.send_packed_command([COMMAND[:4], COMMAND[4:]])
    assert sock.calls == [("sendall", COMMAND[:4]), ("sendall", COMMAND[4:])]


def test_a_failed_send_is_redis_pys_connection_error_and_a_disconnect() -> None:
    broken = BrokenPipeError(32, "Broken pipe")
    conn, sock = connected([broken, broken])  # the send, then redis-py's sendall of the whole command
    with pytest.raises(redis.exceptions.ConnectionError, match="Error 32 while writing to socket"):
        conn.send_packed_command([COMMAND])
    assert sock.calls == [("send", COMMAND), ("sendall", COMMAND)]  # nothing went before: all of it again
    assert conn._sock is None and sock.closed


def test_a_send_that_timed_out_is_redis_pys_timeout_at_once() -> None:
    conn, sock = connected([TimeoutError("timed out")])
    with pytest.raises(redis.exceptions.TimeoutError, match="Timeout writing to socket"):
        conn.send_packed_command([COMMAND])
    assert sock.calls == [("send", COMMAND)]  # not waited for a second time
    assert conn._sock is None and sock.closed


def test_an_interrupted_send_disconnects() -> None:
    class Killed(BaseException):
        """What gevent raises in a greenlet it kills."""

    conn, sock = connected([Killed()])
    with pytest.raises(Killed):
        conn.send_packed_command([COMMAND])
    assert conn._sock is None and sock.closed


def test_the_pool_opens_one_send_connections_of_its_own_kind(tmp_path: Any) -> None:
    client = redis.Redis.from_url(f"unix://{tmp_path}/redis.sock")
    send_in_one(client)
    send_in_one(client)  # twice: the class is mixed once
    kind = client.connection_pool.connection_class
    assert issubclass(kind, OneSend) and issubclass(kind, UnixDomainSocketConnection)
    assert kind.__mro__.count(OneSend) == 1
