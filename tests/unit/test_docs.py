"""The docs restate a few facts the code owns; these tests keep the two from drifting apart.

- docs/configuration.md holds exactly the table that ``taskport config --defaults`` prints;
- every environment variable named anywhere in the code is documented somewhere in the docs;
- every relative link in README.md and docs/ points at a file that exists;
- a setting's default quoted beside its name (`` `TASKPORT_SSE_POLL` (1 s)``) is the Config's default;
- every other figure the docs copy from a code constant (``FIGURES``: "64 bytes", "60 s lease") is the
  constant's value. A figure that is no constant (a measurement, RQ's or gunicorn's behaviour) is free.
"""

from __future__ import annotations

import pkgutil
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from app.core.config import Config
from app.launch.cli import main

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("app", "workers", "clients/python/taskport")
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md",
             ROOT / "bench" / "README.md"]
# A setting's name as the code spells it: REDIS_URL, PORT, WEB_CONCURRENCY or TASKPORT_*.
ENV_NAME = re.compile(r"""["'](REDIS_URL|PORT|WEB_CONCURRENCY|TASKPORT_[A-Z0-9_]+)["']""")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A setting named in backquotes, up to two words (`TASKPORT_X` seconds), then its value in parentheses:
# (2 s), (1 MiB), (default 60), (60 by default), (1,000).
SETTING_FIGURE = re.compile(
    r"`\$?(?P<env>[A-Z][A-Z0-9_]*)`(?:\s+[a-zA-Z]+){0,2}\s+\((?:default\s+)?(?P<number>\d[\d,]*(?:\.\d+)?)"
    r"(?:\s+(?P<unit>[A-Za-z]+))?(?:\s+by\s+default)?\)")
UNITS = {"": 1, "s": 1, "seconds": 1, "ms": 0.001, "min": 60, "minutes": 60, "h": 3600, "day": 86400, "days": 86400,
         "bytes": 1, "KiB": 1024, "MiB": 1024**2}
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # bench/ and tests/ quote their runs'


def _table(text: str) -> list[str]:
    """The first markdown table of ``text``, one string per row."""
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line.rstrip())
        elif rows:
            break
    return rows


def test_the_configuration_page_is_what_taskport_config_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--defaults"]) == 0
    printed = capsys.readouterr().out.splitlines()
    documented = _table((ROOT / "docs" / "configuration.md").read_text())
    assert documented == printed, "regenerate the table: .venv/bin/taskport config --defaults"


def test_every_environment_variable_the_code_names_is_documented() -> None:
    docs = "\n".join(path.read_text() for path in DOC_FILES)
    named = {match for d in CODE_DIRS if (ROOT / d).is_dir()
             for path in (ROOT / d).rglob("*.py") for match in ENV_NAME.findall(path.read_text())}
    assert named, "the pattern found no setting at all: it is broken"
    assert sorted(name for name in named if f"`{name}`" not in docs) == []


@pytest.mark.parametrize("page", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_that_exist(page: Path) -> None:
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")]
    assert [t for t in targets if not (page.parent / t).exists()] == []


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_a_settings_default_quoted_beside_its_name_is_the_configs_default() -> None:
    defaults = {f.metadata["env"]: f.default for f in fields(Config)}
    quoted, wrong = 0, []
    for page in USER_DOCS:
        for m in SETTING_FIGURE.finditer(page.read_text()):
            if m["env"] not in defaults:
                continue  # not a setting (a test's variable)
            quoted += 1
            unit = m["unit"] or ""
            per_default = 60 if unit and m["env"].endswith("_MINUTES") else 1  # (30 min) of a minutes setting
            if unit not in UNITS or _number(m["number"]) * UNITS[unit] != defaults[m["env"]] * per_default:
                wrong.append(f"{page.name}: {' '.join(m[0].split())}, default {defaults[m['env']]}")
    assert quoted >= 20, "the pattern finds almost no quoted default: it is broken"
    assert wrong == []


def _code(*names: str, scale: float = 1) -> Callable[[], tuple[float, ...]]:
    """The constants ``module:attribute`` (resolved when the test runs), times ``scale``."""
    return lambda: tuple(float(pkgutil.resolve_name(name)) * scale for name in names)


def _header(name: str, build: Callable[[Any], Any] = lambda value: value) -> Callable[[], tuple[float, ...]]:
    """The ``Retry-After`` of the header dict (or error) that ``build`` makes of ``module:attribute``."""
    return lambda: (float(build(pkgutil.resolve_name(name))["Retry-After"]),)


RETRY_POLL = _header("app.web.api.tasks:RETRY_AFTER")  # 202s and active statuses
RETRY_503 = _header("app.web.errors:Unavailable", lambda error: error().headers)  # Redis or result store down
CANCEL_GRACE = _code("workers.heartbeat:CANCEL_GRACE")

# (doc, pattern, the code's figures): every match of the pattern in the doc holds the figures (its groups that
# matched), in the doc's unit; the pattern must still match, so a reworded sentence comes back here.
FIGURES: list[tuple[str, str, Callable[[], tuple[float, ...]]]] = [
    ("docs/design.md", r"JSON of at most (\d+) bytes", _code("app.core.runstore:INLINE_RESULT_MAX")),
    ("docs/design.md", r"larger than (\d+) bytes of JSON", _code("app.core.runstore:INLINE_RESULT_MAX")),
    ("docs/streams.md", r"their (\d+) s lease", _code("app.core.keys:STREAM_LEASE_MS", scale=1 / 1000)),
    # renewed at a third of the lease (app.web.streams)
    ("docs/streams.md", r"leases every (\d+) s", _code("app.core.keys:STREAM_LEASE_MS", scale=1 / 3000)),
    ("docs/streams.md", r"for (\d+) ms after the first one \(`COALESCE`",
     _code("app.web.streams:COALESCE", scale=1000)),
    ("docs/streams.md", r"`ExponentialBackoff`, ([\d.]+) s doubling to ([\d.]+) s",
     lambda: (pkgutil.resolve_name("app.web.streams:BACKOFF").compute(1),
              pkgutil.resolve_name("app.web.streams:BACKOFF").compute(1000))),
    ("docs/streams.md", r"cap\) and `Retry-After: (\d+)`", _code("app.web.api.events:FULL_RETRY_AFTER")),
    ("docs/streams.md", r"`--keep-alive` \((\d+) s\)", _code("app.launch.cli:GUNICORN_KEEPALIVE")),
    ("docs/operations.md", r"`--keep-alive (\d+)`", _code("app.launch.cli:GUNICORN_KEEPALIVE")),
    ("docs/operations.md", r"`--graceful-timeout (\d+)`", _code("app.launch.cli:GUNICORN_GRACEFUL_TIMEOUT")),
    ("docs/operations.md", r"after `Retry-After: (\d+)`", RETRY_POLL),
    ("docs/operations.md", r"(\d+) s later \(`CANCEL_GRACE`", CANCEL_GRACE),
    ("docs/operations.md", r"The POST has a (\d+) s timeout", _code("workers.alerts:TIMEOUT")),
    ("docs/operations.md", r"\| failed \| (\d+) hour \|", _code("app.core.jobs:FAILED_JOB_TTL", scale=1 / 3600)),
    ("docs/operations.md", r"\| canceled \| (\d+) hour \|", _code("app.core.jobs:CANCELED_JOB_TTL", scale=1 / 3600)),
    ("docs/operations.md", r"\| finished \| (\d+) minutes, and at most the newest ([\d,]+) per queue",
     lambda: (_code("app.core.jobs:FINISHED_JOB_TTL", scale=1 / 60)() + _code("app.core.jobs:FINISHED_JOBS_KEPT")())),
    ("docs/operations.md", r"registry entry for its (\d+)\s+minutes",
     _code("app.core.jobs:FINISHED_JOB_TTL", scale=1 / 60)),
    ("docs/operations.md", r"pass cut it to ([\d,]+)\.", _code("app.core.jobs:FINISHED_JOBS_KEPT")),
    ("docs/operations.md", r"paused set again\s+every (\d+) s", _code("app.core.jobclaims:WAKE_WAIT")),
    ("docs/processors.md", r"has not stopped (\d+) s after", CANCEL_GRACE),
    ("docs/processors.md", r"every ([\d.]+) s\)", _code("workers.context:SLEEP_SLICE")),
    ("docs/processors.md", r"sweep, every ([\d.]+) s,", _code("app.core.limits:SWEEP_EVERY")),
    ("docs/processors.md", r"its first (\d+)\s+characters", _code("app.core.limitscripts:VALUE_MAX")),
    ("docs/api.md", r"its first (\d+) characters", _code("app.core.limitscripts:VALUE_MAX")),
    ("bench/README.md", r"`CANCEL_GRACE` \((\d+) s\)", CANCEL_GRACE),
    ("docs/storage.md", r"scans at most ([\d,]+) entries", _code("app.core.audit:SCAN_BUDGET")),
    ("docs/storage.md", r"one (\d+) MiB part buffer", _code("app.core.s3store:PART_SIZE", scale=1 / 1024**2)),
    ("docs/storage.md", r"Retry-After: (\d+)", RETRY_503),
    ("docs/self-healing.md", r"Retry-After: (\d+)", RETRY_503),
    ("docs/self-healing.md", r"running for (\d+) s or more", _code("app.launch.supervisorconf:START_SECS")),
    ("docs/self-healing.md", r"dies within (\d+) s of its start", _code("app.launch.supervisorconf:START_SECS")),
    ("docs/self-healing.md", r"After (\d+) failed starts in a row", lambda: (
        pkgutil.resolve_name("app.launch.supervisorconf:START_RETRIES") + 1.0,)),  # the first start and its retries
    ("docs/self-healing.md", r"after (\d+) s whatever is left", _code("app.launch.supervisorconf:STOP_WAIT")),
    ("docs/self-healing.md", r"capped at ([\d.]+) s between tries", _code("app.core.connection:RIDE_OUT_STEP")),
    ("docs/self-healing.md", r"one housekeeping interval \((\d+) s\)", lambda: (
        float(Config.__dataclass_fields__["housekeeping_interval"].default),)),
    ("docs/api.md", r"`Retry-After: (\d+)`; the status document", RETRY_POLL),
    ("docs/api.md", r"`Retry-After: (\d+)` while PENDING", RETRY_POLL),
    ("docs/api.md", r"the status document, `Retry-After: (\d+)`", RETRY_POLL),
    ("docs/api.md", r"\*\*503\*\*[^\n]*?`Retry-After: (\d+)`", RETRY_503),
    ("docs/api.md", r"`Retry-After` is (\d+) s on 202s and on active statuses, and (\d+) s on 503s",
     lambda: RETRY_POLL() + RETRY_503()),
    ("docs/api.md", r"`TASKPORT_MAX_ACTIVE_TASKS`, default (\d+) per member",
     _code("app.core.config:KEYED_MAX_ACTIVE_TASKS")),
    ("docs/api.md", r"\.\.\.\}` with `Retry-After: (\d+)`", _code("app.web.service:ACTIVE_CAP_RETRY_AFTER")),
    ("docs/api.md", r"at most (\d+) characters, 1–([\d,]+) `items`",
     _code("workers.processors.orders_split:MAX_CODE", "workers.processors.orders_split:MAX_ITEMS")),
    ("docs/api.md", r"`fail_items` at most ([\d,]+) entries", _code("workers.processors.demo:MAX_ITEMS")),
    ("docs/api.md", r"([\d,]+) days or more after it|than ([\d,]+) days \(about",
     _code("workers.processors.orders_export:MAX_SPAN_DAYS")),
    ("docs/clients.md", r"\((\d+) s for a running task, (\d+) s after a 503\)", lambda: RETRY_POLL() + RETRY_503()),
    ("docs/deploy.md", r"and `Retry-After: (\d+)`\.",  # /readyz's 503
     _header("app.web.api.health:RETRY_AFTER", lambda value: {"Retry-After": value})),
    ("docs/deploy.md", r"`/problems/unavailable`, `Retry-After: (\d+)`", RETRY_503),
    ("docs/deploy.md", r"\((\d+) × `TASKPORT_STALL_TIMEOUT`", _code("workers.lease:LEASE_STALLS")),
    ("docs/walkthrough.md", r"Retry-After: (\d+)", RETRY_POLL),
    ("README.md", r"Retry-After: (\d+)", RETRY_POLL),
]


@pytest.mark.parametrize(("doc", "pattern", "figures"), FIGURES, ids=[f"{d}: {p}" for d, p, _ in FIGURES])
def test_a_figure_the_docs_copy_from_the_code_is_the_constants_value(
        doc: str, pattern: str, figures: Callable[[], tuple[float, ...]]) -> None:
    found = re.findall(pattern, (ROOT / doc).read_text())
    assert found, f"{doc} no longer says {pattern!r}: update FIGURES (or the doc)"
    expected = figures()
    assert {tuple(_number(g) for g in (m if isinstance(m, tuple) else (m,)) if g) for m in found} == {expected}
