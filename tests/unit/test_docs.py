"""The docs restate a few facts the code owns; these tests keep the two from drifting apart.

- docs/configuration.md holds exactly the table that ``taskport config`` prints;
- every environment variable named anywhere in the code is documented somewhere in the docs;
- every relative link in README.md and docs/ points at a file that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.launch.cli import main

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("app", "workers", "taskport")
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md",
             ROOT / "bench" / "README.md"]
# A setting's name as the code spells it: REDIS_URL, PORT, WEB_CONCURRENCY or TASKPORT_*.
ENV_NAME = re.compile(r"""["'](REDIS_URL|PORT|WEB_CONCURRENCY|TASKPORT_[A-Z0-9_]+)["']""")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


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
    assert main(["config"]) == 0
    printed = capsys.readouterr().out.splitlines()
    documented = _table((ROOT / "docs" / "configuration.md").read_text())
    assert documented == printed, "regenerate the table: .venv/bin/taskport config"


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
