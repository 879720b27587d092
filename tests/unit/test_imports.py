"""The packages and app's wings depend one way, never back (read from the source with ast):
web -> core, launch -> core, workers -> core, and the client package taskport (a distribution of its own,
clients/python) depends on nothing of ours: launch may use it, it uses nothing of the service's.

Every import counts, wherever it stands: at the top, inside a function, under ``if TYPE_CHECKING``.
Where app needs worker code it names it by a dotted string (RQ's job functions, the built-in processor
modules, the worker's and scheduler's mains), resolved when it runs; the last tests check those names
still resolve.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from app.core import housekeeping_passes, jobs, processors
from app.launch.cli import ROLE_MAINS

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ROOT = ROOT / "clients" / "python"  # the client distribution's source (taskport-client)
# Each package and the directory it is imported from.
PACKAGES = {"app": ROOT, "workers": ROOT, "taskport": CLIENT_ROOT}
# The units whose arrows are held: app's three wings, the workers and the client package. The top-level
# app/__init__.py is a docstring and belongs to no wing.
UNITS = ("app.core", "app.web", "app.launch", "workers", "taskport")
# Which unit may import which: the arrows of docs/design.md's module map.
ALLOWED = {
    "app.core": set(),
    "app.web": {"app.core"},
    "app.launch": {"app.core", "taskport"},
    "workers": {"app.core"},
    "taskport": set(),  # it installs without the service: see test_the_client_package_imports_nothing_of_the_service
}


def unit_of(module: str) -> str | None:
    return next((u for u in UNITS if module == u or module.startswith(u + ".")), None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(CLIENT_ROOT if path.is_relative_to(CLIENT_ROOT) else ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[str]:
    """Every module name ``path`` imports (``from a import b`` yields ``a`` and ``a.b``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the modules that make that arrow, for our units only. Importing
    the bare package ``app`` (its docstring) counts for nothing."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for package, root in PACKAGES.items():
        for path in sorted((root / package).rglob("*.py")):
            source = unit_of(module_name(path))
            if source is None:
                assert module_name(path) == "app", f"{path} belongs to no wing"
                continue
            for target in imported(path):
                unit = unit_of(target)
                if unit is not None and unit != source:
                    arrows.setdefault((source, unit), []).append(f"{module_name(path)} imports {target}")
    return arrows


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every cycle of ``graph`` (each found once per node it passes through is fine for a test)."""
    found = []

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append([*path[path.index(nxt):], nxt])
            else:
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_no_module_of_app_imports_workers():
    assert [where for (source, target), where in package_imports().items()
            if source.startswith("app.") and target == "workers"] == []


def test_the_core_imports_no_other_wing():
    assert {arrow: where for arrow, where in package_imports().items() if arrow[0] == "app.core"} == {}


def test_every_module_of_app_is_in_a_wing():
    strays = [p.name for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py"]
    assert strays == []


def test_packages_import_each_other_only_along_the_allowed_arrows():
    unexpected = {arrow: where for arrow, where in package_imports().items() if arrow[1] not in ALLOWED[arrow[0]]}
    assert unexpected == {}


def test_there_is_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for importer, target in package_imports():
        graph.setdefault(importer, set()).add(target)
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"app": {"workers"}, "workers": {"app"}})[0] == ["app", "workers", "app"]
    assert cycles({"workers": {"app"}, "app": {"taskport"}}) == []


def test_the_client_package_imports_nothing_of_the_service():
    strays = [f"{module_name(path)} imports {target}" for path in sorted((CLIENT_ROOT / "taskport").rglob("*.py"))
              for target in imported(path) if target.partition(".")[0] in ("app", "workers")]
    assert strays == []


def test_the_client_package_imports_without_flask_and_pulls_nothing_of_the_service():
    code = ("import sys\n"
            "sys.modules['flask'] = None  # any import of flask now fails\n"
            "import taskport, taskport.client, taskport.cli, taskport.errors, taskport.render\n"
            "print(' '.join(sorted(m for m in sys.modules if m.partition('.')[0] in ('app', 'workers'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_imports_are_read_wherever_they_stand(tmp_path: Path):
    source = ROOT / "app" / "web" / "__init__.py"  # imports inside create_app and under TYPE_CHECKING
    found = set(imported(source))
    assert {"app.core.config", "app.web.api.tasks", "app.core.processors", "flask", "redis"} <= found


@pytest.mark.parametrize("name", sorted({jobs.RUN_TASK, *ROLE_MAINS.values(),
                                         *(f"workers.housekeeping.{p}_pass" for p in housekeeping_passes.PASSES)}))
def test_worker_code_named_by_app_resolves(name: str):
    assert callable(pkgutil.resolve_name(name))


def test_builtin_processor_modules_exist():
    for name in processors.BUILTIN_MODULES:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name
