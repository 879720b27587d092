"""app.core.waitscripts.REPLAY's ``replay``: consecutive HSETs of one key go as one command, the fields in the order
they were sent (RQ's job hash to the byte), whatever the run of HSETs; a held-back HSET is read from its place in
ARGV, not copied into a table (bench/README.md "Lua per call (issue 32)")."""

from __future__ import annotations

import pytest

from app.core.lua import Command, Script, Tail, replay
from app.core.waitscripts import REPLAY

REPLAYS = Script("replays", keys={}, args={"argc": "the commands' ARGV entries"},
                 rest_keys=Tail("command_keys", "a key per command"), rest=Tail("command", "the commands"),
                 body=REPLAY + "replay(first_command, first_command + tonumber(argc), 1)\nreturn 1\n")


@pytest.mark.parametrize("runs", [
    [("a", "1")],
    [("status", "queued"), ("a", "1", "b", "2", "status", "queued")],  # RQ's enqueue: merged
    [("a", "1", "b", "2"), ("c", "3")],
    [("a", "1"), ("b", "2"), ("c", "3")],  # merged two, then one of its own
    [("a", "1", "b", "2"), ("c", "3"), ("d", "4", "e", "5")],
])
def test_consecutive_hsets_of_one_key_write_the_fields_in_order(conn, runs) -> None:
    commands = [Command("HSET", "h", run) for run in runs] + [Command("SADD", "s", ("x",))]
    keys_, args = replay(commands)
    conn.eval(REPLAYS.source(), len(keys_) + 1, *keys_, "audit", len(args), *args)
    expected: dict[bytes, bytes] = {}
    for run in runs:
        for field, value in zip(run[::2], run[1::2], strict=True):
            expected[field.encode()] = value.encode()
    assert conn.hgetall("h") == expected and list(conn.hgetall("h")) == list(expected)
    assert conn.smembers("s") == {b"x"}
