"""Redis commands packed by hiredis without redis-py's per-argument pass (the web's, and the workers').

redis-py's ``HiredisRespSerializer.pack`` turns every argument that is a bytearray or memoryview into bytes, in
a Python generator, before hiredis packs the tuple: ~0.13 µs an argument, ~13 µs for a submit's EVALSHA (~110
arguments: the task's fields and RQ's job), about as much as hiredis' own packing; a worker's delivery packs
dozens (its claim, RQ's start pipeline, START, TRANSITION). Neither the web nor a worker sends either type, and
hiredis refuses one it cannot pack with a TypeError, so :class:`LeanPacker` hands hiredis the arguments as
they are and takes redis-py's own path only then (or for a command name of several words): the same bytes on
the wire, the same DataError for an argument neither packs (tests/unit/test_packer.py).
"""

from __future__ import annotations

from typing import Any

import hiredis  # a dependency (redis[hiredis] in pyproject.toml)
import redis
from redis.connection import HiredisRespSerializer


class LeanPacker(HiredisRespSerializer):
    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if type(first) is str and first.split() == [first]:  # a one-word name: what redis-py's split leaves as is
            try:
                return [hiredis.pack_command(args)]
            except TypeError:  # a bytearray (redis-py converts it) or an argument neither packs (its DataError)
                pass
        return super().pack(*args)  # type: ignore[no-any-return]


def use_lean_packer(conn: redis.Redis) -> None:
    """Have the connections ``conn``'s pool opens from now on pack with :class:`LeanPacker`."""
    conn.connection_pool.connection_kwargs["command_packer"] = LeanPacker()
