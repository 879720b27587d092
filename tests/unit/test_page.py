"""GET /: the submit-and-watch page, its JS client, and the parts of the API it relies on.

What the page *does* is tested in a real browser (tests/browser, `make test-browser`); these tests
pin what is served.
"""

from __future__ import annotations

import dataclasses

import pytest

from app.core import processors
from app.web import create_app


def test_the_page_is_html_with_the_client_its_script_and_a_strict_csp(client):
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    html = r.get_data(as_text=True)
    assert '<script src="/static/taskport.js"></script>' in html  # the plain script tag
    assert '<script type="module" src="/static/page.js"></script>' in html  # the page: an ES module on it
    assert 'id="submit-form"' in html and 'id="progress"' in html and 'aria-live="polite"' in html
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    assert "http://" not in html and "https://" not in html  # nothing from another origin


def test_the_operator_link_shows_only_when_the_dashboard_is_on(config, conn):
    off = create_app(config, conn=conn).test_client().get("/").get_data(as_text=True)
    assert 'href="/rq/"' not in off and "queues (operators)" not in off
    on_config = dataclasses.replace(config, dashboard_password="s3cret")
    on = create_app(on_config, conn=conn).test_client().get("/").get_data(as_text=True)
    assert '<a id="ops-link" href="/rq/">queues (operators)</a>' in on


@pytest.mark.parametrize(("path", "kind"), [
    ("/static/page.js", "javascript"), ("/static/taskport.js", "javascript"), ("/static/taskport.mjs", "javascript"),
    ("/static/batch.mjs", "javascript"), ("/static/times.mjs", "javascript"), ("/static/page.css", "text/css"),
    ("/static/favicon.svg", "image/svg+xml"),
])
def test_the_scripts_and_style_are_served(client, path, kind):
    with client.get(path) as r:
        assert r.status_code == 200
        assert kind in r.headers["Content-Type"]


def test_the_openapi_document_offers_the_page_every_type_with_an_example(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    examples = doc["paths"]["/api/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    assert sorted(examples) == processors.known_types()
    assert all(isinstance(e["value"]["payload"], dict) for e in examples.values())


def test_the_client_exports_its_api_both_ways_and_writes_no_html(client):
    with client.get("/static/taskport.js") as r:
        classic = r.get_data(as_text=True)
    with client.get("/static/taskport.mjs") as r:
        module = r.get_data(as_text=True)
    api = ["submitTask", "watchTask", "cancelTask", "getResult", "listHistory", "TaskportError", "submitBatch",
           "getBatch", "listBatchTasks", "watchBatch", "cancelBatch"]
    assert all(name in classic and name in module for name in api)
    assert "export " not in classic  # a classic script: `export` would be a syntax error in a script tag
    assert 'import "./taskport.js"' in module
    with client.get("/static/page.js") as r:
        page = r.get_data(as_text=True)
    with client.get("/static/batch.mjs") as r:
        batch = r.get_data(as_text=True)
    assert 'from "/static/taskport.mjs"' in page and 'from "/static/taskport.mjs"' in batch
    for script in (classic, page, batch):
        assert "innerHTML" not in script and "fetch(\"http" not in script  # textContent only; same origin only


def test_the_task_view_has_a_place_for_each_shown_field_and_resumed_beside_attempts(client):
    html = client.get("/").get_data(as_text=True)
    with client.get("/static/page.js") as r:
        page = r.get_data(as_text=True)
    for field in ("status", "progress", "message", "succeeded", "failed", "total", "attempts", "created", "updated"):
        assert f'id="{field}"' in html and f'$("{field}")' in page, field
    assert '<span id="attempts">–</span> <span id="resumed" class="muted" hidden></span>' in html
    assert "doc.resumed" in page and '"resumed " + resumed' in page and '$("resumed").hidden = resumed <= 0' in page


def test_the_page_names_its_icon_and_has_a_place_for_the_type_the_batch_and_times(client):
    """The browser tests (tests/browser/test_page_details.py, test_batch_page.py) show them; this pins the places."""
    html = client.get("/").get_data(as_text=True)
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    for field in ("type", "items-term", "batch-of", "callback", "batch", "batch-status", "batch-progress",
                  "batch-counts", "batch-then"):
        assert f'id="{field}"' in html, field
    with client.get("/static/times.mjs") as r:
        times = r.get_data(as_text=True)
    assert "export function timeOf" in times and "element.title = iso" in times
