"""GET /: the submit-and-watch page, and the parts of the API it relies on."""

from __future__ import annotations

import pytest

from app import create_app
from workers import processors


@pytest.fixture
def client(config, conn):
    return create_app(config, conn=conn).test_client()


def test_the_page_is_html_with_its_script_and_a_strict_csp(client):
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    html = r.get_data(as_text=True)
    assert '<script src="/static/page.js" defer></script>' in html
    assert 'id="submit-form"' in html and 'id="progress"' in html
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]


@pytest.mark.parametrize(("path", "kind"), [("/static/page.js", "javascript"), ("/static/page.css", "text/css")])
def test_the_script_and_style_are_served(client, path, kind):
    with client.get(path) as r:
        assert r.status_code == 200
        assert kind in r.headers["Content-Type"]


def test_the_openapi_document_offers_the_page_every_type_with_an_example(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    examples = doc["paths"]["/api/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    assert sorted(examples) == processors.known_types()
    assert all(isinstance(e["value"]["payload"], dict) for e in examples.values())


def test_the_script_follows_with_event_source_and_polls_with_a_key(client):
    with client.get("/static/page.js") as r:
        script = r.get_data(as_text=True)
    assert "new EventSource(doc.links.events)" in script
    assert '"Bearer " + apiKey()' in script
    assert "innerHTML" not in script  # server data is written with textContent only
