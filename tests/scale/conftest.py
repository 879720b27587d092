"""Fixtures of the multi-host bed (tests/scale/bed.py): real namespaces, real servers, root only.

- the session first removes what killed runs left behind (``clean``: beds whose owner is gone) and ends by
  checking that no bed made in this session left a namespace behind;
- ``bed``: one bed per test module, Redis primary + 2 replicas + 3 Sentinels started; a module that kills
  or cuts hosts gets the bed in the state its previous tests left (``bed.primary()`` says who leads);
- a failing test's report carries the log tail of every process the bed started.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.scale.bed import MADE, Bed, clean, netns_names


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_beds() -> Iterator[None]:
    clean()
    yield
    names = netns_names()
    left = [ns for tag in MADE for ns in names if ns.startswith(f"{tag}-")]
    assert not left, f"beds left namespaces behind: {left}"


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    with Bed(tmp_path_factory.mktemp("bed")) as made:
        made.start_redis()
        yield made


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    made = getattr(item, "funcargs", {}).get("bed")
    if report.failed and isinstance(made, Bed):
        report.sections.append(("bed process logs", made.log_tails()))
    return report
