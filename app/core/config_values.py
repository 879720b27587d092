"""Configuration's shared vocabulary: the error every setting raises, and the values more than one group of settings
takes (the worker classes, sizes in bytes).

Its own module so that app.core.config and its siblings (config_keys, config_limits, config_stores), which each own
the parsing of one group of settings, share these without importing one another in a circle.
"""

from __future__ import annotations

from enum import StrEnum

MEMORY_UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3}  # TASKPORT_REDIS_MAXMEMORY's, as redis.conf reads them


class ConfigError(ValueError):
    """An environment variable has a value that cannot be used."""


class WorkerClass(StrEnum):
    """The values of TASKPORT_WORKER_CLASS; the classes they name are workers.worker.WORKER_CLASSES."""

    FORK = "fork"  # a forked work horse per job: a crash or a stop command kills only the horse
    SIMPLE = "simple"  # runs jobs in-process: fastest; a cancel ignored for a grace period ends the process
    SPAWN = "spawn"  # a posix_spawn'd horse: for platforms where fork is unsafe (macOS)


def size_bytes(env: str, text: str) -> int:
    """A size setting in bytes: a whole number, or one with kb, mb or gb (powers of 1024, as redis.conf reads
    them); ConfigError naming the variable ``env`` otherwise."""
    raw = text.strip().lower()
    number, unit = (raw[:-2], raw[-2:]) if raw[-2:] in MEMORY_UNITS else (raw, "")
    if not (number.isascii() and number.isdigit() and len(number) <= 15):
        raise ConfigError(f"{env} must be bytes or a number with kb, mb or gb (1gb), got {text!r}")
    return int(number) * MEMORY_UNITS.get(unit, 1)
