"""The secret that signs read tokens (app.web.tokens), when TASKPORT_TOKEN_SECRET is unset: kept in Redis
(:data:`app.core.keys.TOKEN_SECRET`) so that every web host shares it and it survives restarts.

Here, in the core, because two wings use it: the web reads it (and stores the first one), the launcher's
``taskport tokens rotate`` replaces it. Neither write needs a script: SET NX sent twice keeps the first value
(the second finds it and reads it back), and a rotation's SET sent twice stores the same value.
"""

from __future__ import annotations

import secrets
from typing import cast

import redis

from app.core import keys

RECHECK = 2.0  # seconds between two reads of the stored secret by a web process: a rotation takes effect within this


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def rotate(conn: redis.Redis) -> None:
    """Replace the stored secret (``taskport tokens rotate``): every token minted so far stops counting on every web
    process within :data:`RECHECK` seconds."""
    conn.set(keys.TOKEN_SECRET, new_secret())


def stored_secret(conn: redis.Redis) -> bytes:
    """The secret kept in Redis; the first process to find none stores one (SET NX: sent twice, or by two
    processes at once, the first value stays and every process reads that one)."""
    stored = cast(bytes | None, conn.get(keys.TOKEN_SECRET))  # the client answers bytes
    if stored is None:
        candidate = new_secret().encode()
        stored = candidate if conn.set(keys.TOKEN_SECRET, candidate, nx=True) else \
            cast(bytes | None, conn.get(keys.TOKEN_SECRET))
    if stored is None:  # deleted between the two (by hand): the next request stores one
        raise redis.exceptions.ConnectionError("the token secret was deleted while it was stored")
    return stored
