"""A frontend on its own origin (issue 30), in headless Chromium against the real stack with API keys on.

The frontend is a page served by a tiny static server of the test on another port (a second origin), the one
TASKPORT_CORS_ORIGINS lists. Its source holds what a backend hands it: task ids and read tokens, never a key
(the backend here is this test, holding the key). It loads the JS client with a plain script tag from the
service's origin, as a frontend would, and calls the service cross-origin. A third origin, not listed, serves
the same kind of page: the browser blocks its calls.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from taskport import Client
from tests.browser.test_page import text, until
from tests.integration.harness import Stack, started_stack

KEY = "k-front"  # the backend's key (member acme): only this test holds it, the pages never do
WAIT = 60.0

# The frontend: what the backend handed it is in `handed` (ids and tokens); each step writes what it saw into
# the DOM, for the test to wait for.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a frontend</title>
<script src="{service}/static/taskport.js"></script></head>
<body>
<p>status <span id="status"></span> · <span id="mode"></span> · <span id="outcome"></span></p>
<p id="error"></p>
<ol id="output"></ol>
<p id="file"></p>
<pre id="denied"></pre>
<script>
const handed = {handed};
const tp = window.taskport;
const $ = (id) => document.getElementById(id);
tp.configure({{ baseUrl: handed.service }});
const refusal = (call) => call.then(() => "allowed", (e) => e.status);

async function main() {{
  const {{ done }} = tp.watchTask(handed.watch.task_id, {{
    token: handed.watch.token,
    onProgress: (doc) => {{ $("status").textContent = doc.status; }},
    onMode: (mode) => {{ $("mode").textContent = mode; }},
    onOutput: (line) => {{
      const item = document.createElement("li");
      item.textContent = line.text;
      item.dataset.id = line.id;
      $("output").append(item);
    }},
    onError: (e) => {{ $("error").textContent = e.message; }},
  }}, {{ deadline: 60000 }});
  $("outcome").textContent = await done;

  const exported = {{ token: handed.export.token }};
  const result = await tp.getResult(handed.export.task_id, exported);
  const file = await tp.getResultFile(handed.export.task_id, exported);
  const rows = (await file.text()).trim().split("\\n").length;
  const linked = await fetch(tp.resultFileUrl(handed.export.task_id, exported)); // a plain link's request
  const linkedRows = (await linked.text()).trim().split("\\n").length;
  $("file").textContent = `${{result.result.file.name}}: ${{rows}} rows, by its link ${{linkedRows}}`;

  const watched = {{ token: handed.watch.token }};
  $("denied").textContent = JSON.stringify({{
    other: await refusal(tp.getTask(handed.other, watched)),
    history: await refusal(tp.listHistory({{}}, watched)),
    cancel: await refusal(tp.cancelTask(handed.watch.task_id, watched)),
    submit: await refusal(tp.submitTask("demo.sleep", {{}}, watched)),
  }});
}}
main().catch((e) => {{ $("error").textContent = "thrown: " + e; }});
</script>
</body></html>
"""

# A page of an origin the service does not list: the same calls, each of which the browser must block.
BLOCKED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>elsewhere</title>
<script src="{service}/static/taskport.js"></script></head>
<body><pre id="blocked"></pre>
<script>
const handed = {handed};
const tp = window.taskport;
tp.configure({{ baseUrl: handed.service, token: handed.watch.token }});
const outcome = (call) => call.then(() => "allowed", (e) => e.status === 0 ? "blocked" : e.status);
(async () => {{
  document.getElementById("blocked").textContent = JSON.stringify({{
    status: await outcome(tp.getTask(handed.watch.task_id)),
    output: await outcome(tp.getOutput(handed.watch.task_id)),
    watch: await tp.watchTask(handed.watch.task_id, {{}}, {{ maxAttempts: 2, pollInterval: 100 }}).done,
  }});
}})();
</script>
</body></html>
"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class StaticOrigin:
    """A static file server of ``directory`` on a port of its own: an origin other than the service's."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
        self.thread = threading.Thread(target=self.server.serve_forever, name="static-origin", daemon=True)
        self.thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def publish(self, name: str, html: str) -> str:
        """Write the page ``name`` and return its URL on this origin."""
        (self.directory / name).write_text(html)
        return f"{self.origin}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticOrigin]:
    origin = StaticOrigin(tmp_path_factory.mktemp("front"))
    yield origin
    origin.close()


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticOrigin]:
    origin = StaticOrigin(tmp_path_factory.mktemp("elsewhere"))
    yield origin
    origin.close()


@pytest.fixture(scope="module")
def cors_stack(tmp_path_factory: pytest.TempPathFactory, front: StaticOrigin) -> Iterator[Stack]:
    """The stack with keys on, allowing the frontend's origin (and only it) to call it."""
    with started_stack(tmp_path_factory.mktemp("browser-cors"), api_keys=f"{KEY}:acme",
                       cors_origins=front.origin) as s:
        yield s


def hand_over(stack: Stack) -> dict[str, Any]:
    """What the backend does with its key: submit the tasks, mint the tokens the page gets."""
    with Client(stack.base_url, KEY) as backend:
        watch = backend.submit("demo.sleep", {"seconds": 2, "steps": 4, "output": True}, read_token=True,
                               idempotency_key=uuid.uuid4().hex)
        export = backend.submit("orders.export", {"rows": 25, "format": "csv"}, idempotency_key=uuid.uuid4().hex)
        other = backend.submit("demo.sleep", {"seconds": 0}, idempotency_key=uuid.uuid4().hex)
        return {"service": stack.base_url,
                "watch": {"task_id": watch["task_id"], "token": watch["read_token"]["token"]},
                "export": {"task_id": export["task_id"], **backend.read_token(export["task_id"], ttl=600)},
                "other": other["task_id"]}


def page_source(template: str, handed: dict[str, Any]) -> str:
    html = template.format(service=handed["service"], handed=json.dumps(handed))
    assert KEY not in html and "tpr." in html  # tokens, and no key, in the page's source
    return html


def dom(browser: Chrome, element_id: str, what: str) -> str:
    """The element's text once the page wrote it (failing with the page's error, if it wrote one)."""
    def written(b: Chrome) -> str | None:
        error = text(b, "error") if b.find_elements(By.ID, "error") else ""
        assert not error, error
        return text(b, element_id) or None

    return str(until(browser, written, WAIT, what))


def output_texts(stack: Stack, task_id: str) -> list[str]:
    with Client(stack.base_url, KEY) as backend:
        return [line["text"] for line in backend.output(task_id)["lines"]]


def test_a_page_on_its_own_origin_follows_its_task_with_a_token_and_is_refused_the_rest(
        browser: Chrome, cors_stack: Stack, front: StaticOrigin) -> None:
    handed = hand_over(cors_stack)
    browser.execute_cdp_cmd("Network.enable", {})
    # Every line the page shows comes over the event stream: the output route is blocked for the page.
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/output*"]})
    try:
        browser.get(front.publish("front.html", page_source(PAGE, handed)))
        assert dom(browser, "outcome", "the watched task to end") == "COMPLETED"
        assert text(browser, "status") == "COMPLETED" and text(browser, "mode") == "stream"
        shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#output li")]
        expected = output_texts(cors_stack, handed["watch"]["task_id"])
        assert len(expected) >= 4 and shown == expected  # every line, once, in order
        assert dom(browser, "file", "the result file").endswith(": 26 rows, by its link 26")  # a header, 25 rows
        assert json.loads(dom(browser, "denied", "the refusals")) == {
            "other": 404, "history": 403, "cancel": 403, "submit": 403}
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})


def test_with_its_stream_blocked_the_page_polls_status_and_output_with_its_token(
        browser: Chrome, cors_stack: Stack, front: StaticOrigin) -> None:
    handed = hand_over(cors_stack)
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events*"]})
    try:
        browser.get(front.publish("polling.html", page_source(PAGE, handed)))
        assert dom(browser, "outcome", "the watched task to end") == "COMPLETED"
        assert text(browser, "mode") == "polling"
        shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#output li")]
        assert shown == output_texts(cors_stack, handed["watch"]["task_id"]) and shown
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})


def test_a_page_of_an_origin_not_allowed_is_blocked_by_the_browser(
        browser: Chrome, cors_stack: Stack, elsewhere: StaticOrigin) -> None:
    handed = hand_over(cors_stack)
    browser.get(elsewhere.publish("elsewhere.html", page_source(BLOCKED_PAGE, handed)))
    blocked = json.loads(str(until(browser, lambda b: text(b, "blocked"), WAIT, "the blocked calls")))
    assert blocked == {"status": "blocked", "output": "blocked", "watch": "STILL_RUNNING"}
    # The service answered; it is the browser that kept the answer from the page, for want of an allowing header.
    answer = httpx.get(cors_stack.url(f"/api/v1/tasks/{handed['watch']['task_id']}"),
                       headers={"Origin": elsewhere.origin, "Authorization": f"Bearer {handed['watch']['token']}"})
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers
