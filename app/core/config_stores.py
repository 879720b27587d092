"""Where the data lives: the parsing of the Redis settings (REDIS_URL or Sentinels, the embedded server's memory and
folder), of the result store's location (a folder or an S3 bucket) and of the audit stream's retention, as
properties of :class:`app.core.config.Config`.

Its own module because these settings name the stores every process connects to (app.core.connection,
app.launch.embedded, app.core.results), a concern apart from the settings' list: Config inherits
:class:`StoreSettings`, so ``config.sentinel_addresses`` and the rest read as before.
"""

from __future__ import annotations

from pathlib import Path

from app.core.config_values import ConfigError, WorkerClass, size_bytes


class StoreSettings:
    """The views of Config's store settings (the fields themselves are Config's, in app.core.config)."""

    redis_url: str | None
    redis_sentinels: str
    redis_sentinel_master: str
    worker_class: str
    redis_timeout: float
    redis_ride_out: float
    redis_maxmemory: str
    data_dir: Path
    result_store: str
    audit_retention: str

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each of REDIS_SENTINELS; empty = REDIS_URL names the one Redis."""
        addresses = []
        for entry in filter(None, (e.strip() for e in self.redis_sentinels.split(","))):
            host, sep, port = entry.rpartition(":")
            if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
                raise ConfigError(f"REDIS_SENTINELS entries look like host:port, got {entry!r}")
            addresses.append((host.strip("[]"), int(port)))
        if addresses and not self.redis_sentinel_master:
            raise ConfigError("REDIS_SENTINELS needs REDIS_SENTINEL_MASTER, the name the Sentinels know the primary by")
        if addresses and self.redis_url:
            raise ConfigError("set REDIS_SENTINELS or REDIS_URL, not both: the Sentinels name the primary")
        if addresses and self.worker_class == WorkerClass.SPAWN:
            raise ConfigError("TASKPORT_WORKER_CLASS=spawn does not work with REDIS_SENTINELS (RQ's SpawnWorker is "
                              "reported broken with Sentinel: rq/rq#2281): use simple or fork")
        return addresses

    @property
    def external_redis(self) -> bool:
        """A Redis of the operator's (REDIS_URL or REDIS_SENTINELS): `taskport up` starts no embedded one."""
        return bool(self.redis_url or self.sentinel_addresses)

    @property
    def call_record_ms(self) -> int:
        """How long a script's answer to one call is kept for a repeat of that call (app.core.lua.ONCE_KEY): longer
        than any client of ours keeps sending a call again, twice the ride-out plus a try's timeout each way."""
        return int((self.redis_ride_out + self.redis_timeout) * 2000)

    @property
    def redis_maxmemory_bytes(self) -> int:
        """TASKPORT_REDIS_MAXMEMORY in bytes (0 = no limit), in Redis' own units: kb, mb and gb are powers of 1024."""
        return size_bytes("TASKPORT_REDIS_MAXMEMORY", self.redis_maxmemory)

    @property
    def results_dir(self) -> Path:
        return Path(self.data_dir) / "results"

    @property
    def redis_dir(self) -> Path:
        return Path(self.data_dir) / "redis"

    @property
    def result_location(self) -> tuple[str, str, str]:
        """(scheme, bucket or '', path or prefix) of TASKPORT_RESULT_STORE: ``file``/'' /dir or ``s3``/bucket/prefix."""
        raw = self.result_store.strip()
        if not raw:
            return "file", "", str(self.results_dir)
        scheme, sep, rest = raw.partition("://")
        if scheme == "file" and sep and rest:
            return "file", "", rest
        bucket, _, prefix = rest.partition("/")
        if scheme == "s3" and sep and bucket:
            return "s3", bucket, prefix.strip("/")
        raise ConfigError("TASKPORT_RESULT_STORE must look like file:///path or s3://bucket/prefix")

    @property
    def audit_limits(self) -> tuple[int, int]:
        """(max entries, max age in seconds) of the audit stream; 0 = no limit of that kind."""
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        count = age = 0
        for part in filter(None, (p.strip() for p in self.audit_retention.split(","))):
            number, unit = (part[:-1], units.get(part[-1])) if part[-1] in units else (part, None)
            if not (number.isascii() and number.isdigit() and len(number) <= 12):
                raise ConfigError("TASKPORT_AUDIT_RETENTION looks like 30d,1000000 (an age and/or a count)")
            if unit is None:
                count = int(number)
            else:
                age = int(number) * unit
        if not count and not age:
            raise ConfigError("TASKPORT_AUDIT_RETENTION needs an age (30d) or an entry count (1000000)")
        return count, age
