"""Browser fixtures: the real stack (gunicorn, an RQ worker, redis-server) and headless Chromium from the
system packages (``apt-get install chromium chromium-driver``), driven by selenium through
/usr/bin/chromedriver. Nothing is downloaded: selenium is handed the driver and the browser binary.

Screenshots go to ``build/browser/`` (override with TASKPORT_BROWSER_ARTIFACTS); CI keeps them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.integration.harness import REPO_ROOT, Stack, started_stack

CHROMIUM = os.environ.get("TASKPORT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TASKPORT_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1100,1500")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("TASKPORT_BROWSER_ARTIFACTS", REPO_ROOT / "build" / "browser"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("browser")) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"{binary} is missing: apt-get install -y chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="taskport-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for driver.get_log("browser")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def keyed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A second stack with API keys on (key ``k-browser`` for member ``acme``)."""
    with started_stack(tmp_path_factory.mktemp("browser-keyed"), api_keys="k-browser:acme") as s:
        yield s
