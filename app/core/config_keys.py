"""Who may call, and what signs: the parsing of API keys (members, their grants and weights), callback signing
secrets and CORS origins, as properties of :class:`app.core.config.Config`, and the read tokens' constants.

Its own module because these settings are the web's credentials (app.core.config.WEB_ONLY), read by app.web.auth,
app.web.tokens and workers.delivery, and their parsing is a concern apart from the settings' list: Config inherits
:class:`AccessSettings`, so ``config.members`` and the rest read as before.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import urlsplit

from app.core.config_values import ConfigError
from app.core.states import HIGH_QUEUE

HIGH_PRIORITY_GRANT = HIGH_QUEUE  # the third field of a TASKPORT_API_KEYS entry (key:member:high)
MAX_WEIGHT = 100  # the largest weight a TASKPORT_API_KEYS entry may give its member (key:member:N)
WEBHOOK_SECRET_PREFIX = "whsec_"  # a Standard Webhooks secret: this, then the key's bytes in base64
WEBHOOK_KEY_BYTES = (24, 64)  # the key lengths the Standard Webhooks specification recommends
MIN_TOKEN_SECRET = 32  # characters of a TASKPORT_TOKEN_SECRET: a guessable one would let anyone mint read tokens
READ_TOKEN_PREFIX = "tpr."  # every read token starts so (app.web.tokens): no API key may, so the two are told apart


class AccessSettings:
    """The views of Config's access settings (the fields themselves are Config's, in app.core.config)."""

    api_keys: str
    callback_secrets: str
    callback_allow_hosts: str
    cors_origins: str

    @property
    def members(self) -> dict[str, str]:
        """API key -> member. Empty in open development mode."""
        return {key: member for key, (member, _) in self.grants.items()}

    @property
    def grants(self) -> dict[str, tuple[str, bool]]:
        """API key -> (member, whether that key may submit ``priority: high``)."""
        return {key: (member, high) for key, (member, high, _) in self._entries().items()}

    @property
    def weights(self) -> dict[str, int]:
        """Member -> its weight in fair dispatch (app.core.lines), for the members given one other than 1: the
        largest of its keys' (``key:member:3``, ``key:member:high:3``)."""
        weights: dict[str, int] = {}
        for member, _, weight in self._entries().values():
            weights[member] = max(weights.get(member, 1), weight)
        return {member: weight for member, weight in weights.items() if weight != 1}

    def _entries(self) -> dict[str, tuple[str, bool, int]]:
        """API key -> (member, may submit high, weight): ``key:member[:high][:weight]``."""
        keys: dict[str, tuple[str, bool, int]] = {}
        for entry in filter(None, (e.strip() for e in self.api_keys.split(","))):
            key, sep, rest = entry.partition(":")
            member, *grants = rest.split(":")
            high = bool(grants) and grants[0] == HIGH_PRIORITY_GRANT
            weight = grants[int(high)] if len(grants) > int(high) else "1"
            if not sep or not key or not member or len(grants) > int(high) + 1 \
                    or not weight.isdigit() or not 1 <= int(weight) <= MAX_WEIGHT:
                raise ConfigError("TASKPORT_API_KEYS entries look like key:member, key:member:high, key:member:N "
                                  f"or key:member:high:N (N: a weight in fair dispatch, 1 to {MAX_WEIGHT})")
            if key.startswith(READ_TOKEN_PREFIX):
                raise ConfigError(f"TASKPORT_API_KEYS: a key may not start with {READ_TOKEN_PREFIX} (read tokens do)")
            keys[key] = (member, high, int(weight))
        return keys

    @property
    def callback_keys(self) -> dict[str, str]:
        """Member -> its callback signing secret (``whsec_...``, as the standardwebhooks library takes it), from
        TASKPORT_CALLBACK_SECRETS. A malformed entry raises ConfigError naming the entry, never showing the secret."""
        secrets: dict[str, str] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.callback_secrets.split(","))), 1):
            member, sep, secret = (part.strip() for part in entry.partition(":"))
            what = ("no member" if not sep or not member else _secret_problem(secret)
                    or ("a member named twice" if member in secrets else ""))
            if what:
                low, high = WEBHOOK_KEY_BYTES
                raise ConfigError(f"TASKPORT_CALLBACK_SECRETS entries look like member:{WEBHOOK_SECRET_PREFIX}<base64 "
                                  f"of {low} to {high} random bytes>; entry {n} has {what}")
            secrets[member] = secret
        return secrets

    @property
    def cors_allowed(self) -> tuple[str, ...]:
        """TASKPORT_CORS_ORIGINS: the exact origins (scheme://host[:port], lower case) whose pages may call the task
        API cross-origin; ConfigError for an entry that is no origin (a path, a ``*``, another scheme)."""
        origins: list[str] = []
        for entry in filter(None, (e.strip() for e in self.cors_origins.split(","))):
            try:
                parts = urlsplit(entry)
                port = parts.port  # ValueError when out of range or no number
                usable = (parts.scheme in ("http", "https") and bool(parts.hostname) and "*" not in entry
                          and parts.path == "" and not (parts.query or parts.fragment or parts.username)
                          and entry.count("//") == 1 and port != 0 and not entry.endswith(":"))
            except ValueError:
                usable = False
            if not usable:
                raise ConfigError(f"TASKPORT_CORS_ORIGINS entries are exact origins like https://app.example.com or "
                                  f"http://localhost:3000 (no path, no *), got {entry!r}")
            default_port = (parts.scheme, port) in (("http", 80), ("https", 443))  # a browser's Origin leaves it out
            origins.append(f"{parts.scheme}://{parts.netloc.lower().removesuffix(f':{port}')}" if default_port
                           else entry.lower())
        return tuple(dict.fromkeys(origins))

    @property
    def callback_hosts(self) -> frozenset[str]:
        """TASKPORT_CALLBACK_ALLOW_HOSTS: host names (lower case, an IPv6 address without brackets) a callback
        may go to whatever they resolve to, over http too."""
        return frozenset(h.strip().strip("[]").lower() for h in self.callback_allow_hosts.split(",") if h.strip())


def _secret_problem(secret: str) -> str:
    """What is wrong with a TASKPORT_CALLBACK_SECRETS secret ('' = nothing), in words that never show it."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        return f"a secret that does not start with {WEBHOOK_SECRET_PREFIX}"
    encoded = secret[len(WEBHOOK_SECRET_PREFIX):]
    try:  # strict, where the library's own decoding skips what is not base64
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        return "a secret that is not base64"
    low, high = WEBHOOK_KEY_BYTES
    return "" if low <= len(key) <= high else f"a key of {len(key)} bytes"
