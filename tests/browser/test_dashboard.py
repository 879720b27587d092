"""rq-dashboard in a real browser: its own buttons still work now that its actions take same-origin POSTs
only (Chromium sends ``Origin`` with jQuery's POST), while the image-tag attack does nothing."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
import rq
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.integration.harness import Stack, started_stack, wait_until

PASSWORD = "op-secret"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("browser-dashboard"), worker=False, dashboard_password=PASSWORD) as s:
        yield s


@pytest.fixture
def operator(browser: Chrome) -> Chrome:
    """The browser sending the operator's Basic credentials with every request, as one that saved them."""
    token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
    return browser


def failed_job(stack: Stack) -> tuple[rq.Queue, str]:
    conn = stack.redis()
    queue = rq.Queue("default", connection=conn)
    job = queue.enqueue("builtins.int", "not a number")
    rq.SimpleWorker([queue], connection=conn).work(burst=True)
    assert job.id in queue.failed_job_registry.get_job_ids()
    return queue, job.id


def test_the_requeue_button_works_and_an_image_tag_does_nothing(operator: Chrome, stack: Stack) -> None:
    queue, job_id = failed_job(stack)
    # another site's page with <img src=".../rq/requeue/default">: the browser adds the credentials
    operator.get("data:text/html,<img src='" + stack.url("/rq/requeue/default") + "'>")
    operator.get(stack.url("/rq/0/view/jobs/default/failed/8/asc/1"))  # a page load: the img had its chance
    assert queue.count == 0 and job_id in queue.failed_job_registry.get_job_ids()

    button = wait_until(lambda: operator.find_elements(By.CSS_SELECTOR, "[data-role=requeue-job-btn]"),
                        timeout=15, message="the failed job's requeue button")
    button[0].click()
    wait_until(lambda: queue.get_job_ids() == [job_id], timeout=15, message="the job back in its queue")
    assert job_id not in queue.failed_job_registry.get_job_ids()
