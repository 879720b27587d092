"""The client's settings: where the service is and which API key to send.

The server's settings have one home, ``app.core.config.Config``, the only reader of ``os.environ`` on the
server side. The client is a separate program (it runs wherever a script or a shell runs, usually
not beside the server), so it has its own, much smaller home: this module is the only place the
client package reads the environment.

    TASKPORT_URL      base URL of the service (default http://127.0.0.1:8000, what `taskport up` serves)
    TASKPORT_API_KEY  the API key sent as `Authorization: Bearer <key>` (default: none, open mode)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_URL = "http://127.0.0.1:8000"
URL_VARIABLE = "TASKPORT_URL"
API_KEY_VARIABLE = "TASKPORT_API_KEY"


@dataclass(frozen=True)
class ClientSettings:
    """Where the service is (``url``, no trailing slash) and the API key to send (None: none)."""

    url: str = DEFAULT_URL
    api_key: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        """Read ``TASKPORT_URL`` and ``TASKPORT_API_KEY`` (empty counts as unset)."""
        env = os.environ if environ is None else environ
        url = (env.get(URL_VARIABLE) or "").strip() or DEFAULT_URL
        key = (env.get(API_KEY_VARIABLE) or "").strip() or None
        return cls(url=url.rstrip("/"), api_key=key)
