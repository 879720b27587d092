"""requirements.txt (what a Heroku-style buildpack installs) is compiled from pyproject.toml: `make lock`.

Fails when a dependency was added, removed or re-pinned in pyproject.toml without running `make lock`
again: the lock's direct dependencies ("via taskport (pyproject.toml)") must be exactly pyproject's,
each pinned to a version its range allows.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]

PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def lock() -> tuple[dict[str, str], set[str]]:
    """(name -> pinned version, names the lock says come straight from pyproject.toml)."""
    pins: dict[str, str] = {}
    direct: set[str] = set()
    current = ""
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match.group(1))
            pins[current] = match.group(2)
        elif "taskport (pyproject.toml)" in line:
            direct.add(current)
    return pins, direct


def test_the_lock_pins_exactly_pyprojects_dependencies_within_their_ranges() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    pins, direct = lock()
    assert direct == set(wanted), "requirements.txt is stale: run `make lock`"
    for name, requirement in wanted.items():
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement.specifier}: run `make lock`")
        for extra in requirement.extras:  # redis[hiredis] pulls hiredis in
            assert extra in pins, f"{name}[{extra}] is not in the lock: run `make lock`"


def test_the_python_version_is_one_pyproject_allows() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    version = (REPO_ROOT / ".python-version").read_text().strip()
    assert re.fullmatch(r"3\.\d+", version), "Heroku's buildpack reads a major.minor version"
    assert Requirement(f"python{project['requires-python']}").specifier.contains(f"{version}.0")


def test_the_procfile_runs_without_the_console_script_on_path() -> None:
    lines = dict(line.split(": ", 1) for line in (REPO_ROOT / "Procfile").read_text().splitlines() if line)
    assert lines == {role: f"python -m app.launch.cli {role}" for role in ("web", "worker", "scheduler", "deliverer")}


def test_app_json_starts_every_procfile_process_with_a_redis() -> None:
    app = json.loads((REPO_ROOT / "app.json").read_text())
    procfile = [line.split(":", 1)[0] for line in (REPO_ROOT / "Procfile").read_text().splitlines() if line]
    assert sorted(app["formation"]) == sorted(procfile)
    assert all(app["formation"][name]["quantity"] >= 1 for name in procfile)
    assert any(addon["plan"].startswith("heroku-redis") for addon in app["addons"])
    assert app["env"]["TASKPORT_REDIS_TLS_VERIFY"]["value"] == "none"  # Heroku Redis' self-signed certificate
