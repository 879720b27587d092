"""The lock files, compiled from pyproject.toml by `make lock`: requirements.txt (the runtime dependencies:
what `make up` and a Heroku-style buildpack install) and requirements-dev.txt (those and the dev extra: what
`make test` and CI install).

Fails when a dependency was added, removed or re-pinned in pyproject.toml without running `make lock`
again: each lock's direct dependencies ("via taskport (pyproject.toml)") must be exactly pyproject's, each
pinned to a version its range allows, with what its extras bring; and the two locks must pin every package
they share alike, so that what runs is what was tested.

The client distribution (taskport-client, clients/python) is one of them, from the checkout (pyproject's
[tool.uv.sources]): requirements.txt installs it as ``-e clients/python``, requirements-dev.txt leaves it out
(the Makefile installs it, and uv takes no path as the runtime lock's constraint); both pin its dependencies.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = "requirements.txt"
DEV_LOCK = "requirements-dev.txt"

PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")
EDITABLE = re.compile(r"^-e (\S+)$")
CLIENT = "taskport-client"
CLIENT_DIR = "clients/python"


def project_of(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())["project"]


def lock(name: str) -> tuple[dict[str, str], set[str]]:
    """(package -> pinned version, packages the lock says come straight from pyproject.toml). A path the lock
    installs (``-e clients/python``) counts as its distribution, pinned to the version its pyproject.toml says."""
    pins: dict[str, str] = {}
    direct: set[str] = set()
    current = ""
    for line in (REPO_ROOT / name).read_text().splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match.group(1))
            pins[current] = match.group(2)
        elif match := EDITABLE.match(line):
            assert match.group(1) == CLIENT_DIR, f"{name}: {line!r} is no path of ours"
            project = project_of(REPO_ROOT / CLIENT_DIR)
            current = canonicalize_name(project["name"])
            pins[current] = project["version"]
        elif "taskport (pyproject.toml)" in line:
            direct.add(current)
    return pins, direct


def wanted(name: str) -> list[Requirement]:
    """The requirements of pyproject.toml a lock compiles: the runtime ones, and the dev extra's for the dev lock."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["dev"] if name == DEV_LOCK else []
    return [Requirement(line) for line in [*project["dependencies"], *extra]]


def brought_by_extras(requirement: Requirement) -> set[str]:
    """The packages ``requirement``'s extras add (redis[hiredis]: hiredis), as its installed metadata says."""
    found: set[str] = set()
    for extra in requirement.extras:
        for line in importlib.metadata.requires(requirement.name) or []:
            needed = Requirement(line)
            environment = {"extra": extra, "sys_platform": "linux", "platform_system": "Linux"}
            if needed.marker is not None and "extra" in str(needed.marker) and needed.marker.evaluate(environment):
                found.add(canonicalize_name(needed.name))
    return found


@pytest.mark.parametrize("name", [RUNTIME_LOCK, DEV_LOCK])
def test_the_lock_pins_exactly_pyprojects_dependencies_within_their_ranges(name: str) -> None:
    requirements = {canonicalize_name(r.name): r for r in wanted(name)}
    if name == DEV_LOCK:  # the Makefile installs the client from its path; the lock says it left it out
        assert (REPO_ROOT / name).read_text().rstrip().endswith(f"excluded from the output:\n# {CLIENT}")
        del requirements[CLIENT]
    pins, direct = lock(name)
    assert direct == set(requirements), f"{name} is stale: run `make lock`"
    for package, requirement in requirements.items():
        assert requirement.specifier.contains(pins[package], prereleases=True), (
            f"{name}: {package}=={pins[package]} is outside {requirement.specifier}: run `make lock`")
        missing = brought_by_extras(requirement) - set(pins)
        assert not missing, f"{name}: {requirement} needs {sorted(missing)}, not in the lock: run `make lock`"


@pytest.mark.parametrize("name", [RUNTIME_LOCK, DEV_LOCK])
def test_the_lock_pins_the_client_distributions_dependencies_within_their_ranges(name: str) -> None:
    pins, _ = lock(name)
    for requirement in map(Requirement, project_of(REPO_ROOT / CLIENT_DIR)["dependencies"]):
        package = canonicalize_name(requirement.name)
        assert package in pins, f"{name}: {CLIENT} needs {package}, not in the lock: run `make lock`"
        assert requirement.specifier.contains(pins[package], prereleases=True), (
            f"{name}: {package}=={pins[package]} is outside {CLIENT}'s {requirement.specifier}: run `make lock`")


def test_the_service_takes_the_client_from_the_checkout() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["uv"]["sources"][CLIENT] == {"path": CLIENT_DIR, "editable": True}
    assert project_of(REPO_ROOT / CLIENT_DIR)["name"] == CLIENT


def test_the_two_locks_pin_what_they_share_alike() -> None:
    runtime, _ = lock(RUNTIME_LOCK)
    dev, _ = lock(DEV_LOCK)
    del runtime[CLIENT]  # from its path, in requirements.txt only
    assert runtime.keys() <= dev.keys(), f"only in {RUNTIME_LOCK}: {sorted(runtime.keys() - dev.keys())}"
    differ = {package: (version, dev[package]) for package, version in runtime.items() if dev[package] != version}
    assert not differ, f"pinned apart ({RUNTIME_LOCK}, {DEV_LOCK}): {differ}: run `make lock`"


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
