"""Limits and quotas: the parsing of the per-member caps (unfinished tasks, stored bytes, request rate) and of the
per-type concurrency limits and named rate limits, as properties of :class:`app.core.config.Config`.

Its own module because these settings share one grammar of their own (``off``, keyed defaults, ``type=N/key``,
``name=N/period``) that app.core.limits, app.core.processors and the web's limiter read, apart from the settings'
list: Config inherits :class:`LimitSettings`, so ``config.concurrency_limits`` and the rest read as before. It
builds on :class:`~app.core.config_keys.AccessSettings`: a quota's default depends on whether API keys are set
(and its validation step checks CORS and the token secret with the limits, as Config.validate always did).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from app.core.config_keys import MIN_TOKEN_SECRET, AccessSettings
from app.core.config_values import ConfigError, size_bytes

KEYED_RATE_LIMIT = "100/second;3000/minute"  # per member, when API keys are configured and no limit is set
KEYED_MAX_ACTIVE_TASKS = 1000  # unfinished tasks per member, when API keys are configured and no cap is set
KEYED_MAX_STORED_BYTES = 256 * 2**20  # bytes a member's tasks may hold in Redis, with API keys and no quota set


class LimitSettings(AccessSettings):
    """The views of Config's limit settings (the fields themselves are Config's, in app.core.config)."""

    max_active_tasks: str
    max_stored_bytes: str
    rate_limit: str
    concurrency: str
    rate_limits: str
    rate_wait_max: float
    token_secret: str

    def _validate_limits_and_tokens(self) -> None:
        """The rules of concurrency and rate limits (app.core.limits), CORS and read tokens (app.web.tokens)."""
        self.concurrency_limits  # noqa: B018
        self.rate_limit_table  # noqa: B018
        if self.rate_wait_max < 0:
            raise ConfigError("TASKPORT_RATE_WAIT_MAX must be 0 or more seconds")
        self.cors_allowed  # noqa: B018
        if self.token_secret and len(self.token_secret) < MIN_TOKEN_SECRET:
            raise ConfigError(f"TASKPORT_TOKEN_SECRET must be at least {MIN_TOKEN_SECRET} characters (random: "
                              "python -c 'import secrets; print(secrets.token_urlsafe(32))')")

    @property
    def active_task_cap(self) -> int:
        """Unfinished tasks one member may hold (0 = no cap): on by default with API keys, off in open mode."""
        def whole(raw: str) -> int:
            if not (raw.isascii() and raw.isdigit() and 0 < int(raw) < 2**31):
                raise ConfigError("TASKPORT_MAX_ACTIVE_TASKS must be a positive whole number or off")
            return int(raw)

        return self._member_quota(self.max_active_tasks, KEYED_MAX_ACTIVE_TASKS, whole)

    @property
    def stored_bytes_cap(self) -> int:
        """Bytes one member's tasks may hold in Redis (0 = no quota): on by default with API keys, off in open mode."""
        def size(raw: str) -> int:
            cap = size_bytes("TASKPORT_MAX_STORED_BYTES", raw)
            if not cap:
                raise ConfigError("TASKPORT_MAX_STORED_BYTES must be a positive size (e.g. 256mb) or off")
            return cap

        return self._member_quota(self.max_stored_bytes, KEYED_MAX_STORED_BYTES, size)

    def _member_quota(self, text: str, keyed: int, parse: Callable[[str], int]) -> int:
        """A per-member quota setting: ``off`` = 0 (none); unset = ``keyed`` with API keys, 0 in open mode (one
        trusted user); else ``parse`` of the value (ConfigError naming the variable for a bad one)."""
        raw = text.strip().lower()
        if raw == "off":
            return 0
        if not raw:
            return keyed if self.api_keys.strip() else 0
        return parse(raw)

    @property
    def request_limit(self) -> str:
        """The per-member rate limit in force ("" = none): open mode is one trusted user, so no default."""
        if self.rate_limit.strip().lower() == "off":
            return ""
        return self.rate_limit.strip() or (KEYED_RATE_LIMIT if self.members else "")

    @property
    def concurrency_limits(self) -> dict[str, tuple[int, str]]:
        """Task type -> (N, key) of TASKPORT_CONCURRENCY: at most N runs at once per value of the key (``member``,
        ``type``, ``payload.<field>``); N 0 lifts a processor's own limit. ConfigError names a bad entry."""
        limits: dict[str, tuple[int, str]] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.concurrency.split(","))), 1):
            type_, sep, rest = (part.strip() for part in entry.partition("="))
            number, slash, key = (part.strip() for part in rest.partition("/"))
            what = ("no type" if not sep or not type_ else "no N/key after =" if not slash
                    else "N not a whole number" if not (number.isascii() and number.isdigit() and len(number) < 7)
                    else concurrency_key_problem(key) or ("a type named twice" if type_ in limits else ""))
            if what:
                raise ConfigError("TASKPORT_CONCURRENCY entries look like type=N/member, type=N/type or "
                                  f"type=N/payload.<field>; entry {n} ({entry!r}) has {what}")
            limits[type_] = (int(number), key)
        return limits

    @property
    def rate_limit_table(self) -> dict[str, tuple[float, float]]:
        """Rate limit name -> (tokens, per seconds) of TASKPORT_RATE_LIMITS (``erp=20/1s``). ConfigError names a bad
        entry."""
        table: dict[str, tuple[float, float]] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.rate_limits.split(","))), 1):
            name, sep, rest = (part.strip() for part in entry.partition("="))
            rate, _, period = (part.strip() for part in rest.partition("/"))
            per = rate_period(period)
            what = ("no name" if not sep or not RATE_NAME.fullmatch(name) else "a name given twice" if name in table
                    else "no whole number of tokens"
                    if not (rate.isascii() and rate.isdigit() and 0 < int(rate) < 10**9)
                    else "no period (1s, 500ms, 1m, 1h)" if per is None else "")
            if what:
                raise ConfigError(f"TASKPORT_RATE_LIMITS entries look like name=20/1s (a name of letters, digits, "
                                  f"._-, tokens, a period); entry {n} ({entry!r}) has {what}")
            table[name] = (float(rate), per)  # type: ignore[assignment]
        return table


CONCURRENCY_KEYS = ("member", "type")  # and payload.<field>: what a concurrency limit counts runs per
PAYLOAD_KEY = "payload."
_FIELD_PATH = re.compile(r"[A-Za-z0-9_-]{1,100}(\.[A-Za-z0-9_-]{1,100}){0,4}")
RATE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_PERIOD_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PERIOD = re.compile(r"(\d{0,9}(?:\.\d{1,3})?)(ms|s|m|h)")


def concurrency_key_problem(key: str) -> str:
    """What is wrong with a concurrency key (``member``, ``type``, ``payload.<field>``), '' when nothing."""
    if key in CONCURRENCY_KEYS:
        return ""
    if key.startswith(PAYLOAD_KEY) and _FIELD_PATH.fullmatch(key[len(PAYLOAD_KEY):]):
        return ""
    return f"key {key!r}, not member, type or payload.<field>"


def rate_period(text: str) -> float | None:
    """Seconds of a rate limit's period (``1s``, ``500ms``, ``1m``, ``1h``; ``s`` alone is ``1s``), None if it is
    none of these or not positive."""
    match = _PERIOD.fullmatch(text.strip())
    if match is None:
        return None
    seconds = float(match[1] or "1") * _PERIOD_UNITS[match[2]]
    return seconds if seconds > 0 else None


def check_rate_limit(text: str) -> None:
    from limits import parse_many  # flask-limiter's own parser: the same grammar it will apply

    try:
        parse_many(text)
    except ValueError as exc:
        raise ConfigError(f"TASKPORT_RATE_LIMIT must look like 100/second;3000/minute, got {text!r}") from exc
