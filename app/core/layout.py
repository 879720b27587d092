"""The Redis layout's version, and the one-time upgrade of a Redis written by an earlier layout.

Layout 2 (this one) puts every taskport key on the one hash tag ``{tp}`` (app.core.keys). Layout 1 wrote
``tp:`` keys, a task's own under a ``{<task id>}`` tag: ``tp:task:{<id>}:payload``. A Redis that still holds
layout-1 keys (an upgrade with tasks in it, the embedded server's data dir of an earlier version) is
upgraded in place by :func:`upgrade` before the processes that use it start: each key renamed (RENAME keeps
its value and its TTL), then the version recorded. It is safe to run twice or from several processes at
once: a key already renamed by another is skipped.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from app.core import keys
from app.core.config import ConfigError

VERSION = 2
MIN_SERVER = (7, 0)  # the oldest Redis that reads a script's declaration (app.core.lua.SHEBANG)
VERSION_KEY = keys.LAYOUT
OLD_PREFIX = "tp:"
OLD_TASK = f"{OLD_PREFIX}task:{{"
BATCH = 1000  # keys per SCAN step

log = logging.getLogger(__name__)


def new_name(old: str) -> str:
    """A layout-1 key's layout-2 name: ``tp:task:{<id>}...`` -> ``{tp}:task:<id>...``, ``tp:x`` -> ``{tp}:x``."""
    if old.startswith(OLD_TASK):
        task_id, _, rest = old[len(OLD_TASK):].partition("}")
        return f"{keys.PREFIX}task:{task_id}{rest}"
    return keys.PREFIX + old[len(OLD_PREFIX):]


def upgrade(conn: Any) -> int:
    """Bring a Redis of an earlier layout to this one; returns how many keys were renamed (0 when it already
    is in this layout, or holds nothing of taskport's). Raises ConfigError on a server older than
    MIN_SERVER, before anything runs a script on it."""
    try:
        found = str(conn.info("server").get("redis_version", "0"))
    except redis.ResponseError:  # a server without INFO (fakeredis, in the unit tests): nothing to go by
        found = ".".join(map(str, MIN_SERVER))
    if tuple(int(part) for part in found.split(".")[:2] if part.isdigit()) < MIN_SERVER:
        raise ConfigError(f"Redis {found} is too old: taskport needs Redis 7.0 or later, or Valkey (its scripts "
                          "declare themselves, app.core.lua.SHEBANG)")
    if conn.get(VERSION_KEY) is not None:
        return 0
    renamed = 0
    for raw in conn.scan_iter(match=f"{OLD_PREFIX}*", count=BATCH):
        old = raw.decode() if isinstance(raw, bytes) else raw
        try:
            renamed += int(bool(conn.renamenx(old, new_name(old))))
        except redis.ResponseError:  # renamed meanwhile by another process: nothing left to do for it
            continue
    conn.set(VERSION_KEY, VERSION)
    if renamed:
        log.warning("Redis upgraded to taskport's key layout %d: %d keys renamed", VERSION, renamed)
    return renamed
