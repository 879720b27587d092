"""Who is calling: API key -> member. With no keys configured, everyone is the member ``public``."""

from __future__ import annotations

import hmac
import logging

from flask import request

from app.config import Config
from app.errors import Unauthorized

OPEN_MEMBER = "public"
log = logging.getLogger(__name__)


class Members:
    def __init__(self, config: Config) -> None:
        self.keys = config.members
        if not self.keys:
            log.warning("no TASKPORT_API_KEYS configured: open development mode, every caller is %r", OPEN_MEMBER)

    def current(self) -> str:
        """The calling member, from ``Authorization: Bearer <key>``; 401 for a missing or unknown key."""
        if not self.keys:
            return OPEN_MEMBER
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            for key, member in self.keys.items():
                if hmac.compare_digest(key.encode(), token.strip().encode()):
                    return member
        raise Unauthorized("send Authorization: Bearer <api key>", headers={"WWW-Authenticate": "Bearer"})
