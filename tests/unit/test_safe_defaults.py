"""Safe defaults: with no API keys the web stays on loopback, and answers only its own host names."""

from __future__ import annotations

import pytest

from app.core.config import Config, ConfigError
from app.web import create_app


def test_without_keys_the_web_binds_loopback_and_with_keys_every_interface() -> None:
    assert Config.from_env({}).host == "127.0.0.1"
    assert Config.from_env({"TASKPORT_API_KEYS": "k:alice"}).host == "0.0.0.0"
    assert Config.from_env({"TASKPORT_HOST": "10.1.2.3", "TASKPORT_API_KEYS": "k:alice"}).host == "10.1.2.3"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_a_public_bind_without_keys_is_refused_with_one_clear_line(host: str) -> None:
    with pytest.raises(ConfigError, match="TASKPORT_ALLOW_OPEN=1"):
        Config.from_env({"TASKPORT_HOST": host})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_loopback_binds_need_no_keys(host: str) -> None:
    assert Config.from_env({"TASKPORT_HOST": host}).host == host


def test_allow_open_lets_an_operator_choose_a_public_bind_without_keys() -> None:
    assert Config.from_env({"TASKPORT_HOST": "0.0.0.0", "TASKPORT_ALLOW_OPEN": "1"}).allow_open is True


@pytest.mark.parametrize("host, status", [
    ("127.0.0.1:8000", 200), ("localhost:8000", 200), ("[::1]:8000", 200), ("LOCALHOST", 200),
    ("evil.example:8000", 400), ("evil.example", 400), ("127.0.0.1.evil.example", 400),
])
def test_open_mode_answers_only_its_own_host_names(config, conn, host: str, status: int) -> None:
    client = create_app(config, conn=conn).test_client()
    response = client.get("/healthz", headers={"Host": host})
    assert response.status_code == status
    if status == 400:
        assert response.content_type == "application/problem+json"
        assert "Host" in response.get_json()["errors"]


def test_allowed_hosts_extend_the_open_mode_names(tmp_path, conn) -> None:
    config = Config.from_env({"TASKPORT_ALLOWED_HOSTS": "tasks.lan, other.lan"}, redis_url="redis://fake",
                             data_dir=tmp_path)
    client = create_app(config, conn=conn).test_client()
    assert client.get("/healthz", headers={"Host": "tasks.lan:8000"}).status_code == 200
    assert client.get("/healthz", headers={"Host": "third.lan"}).status_code == 400


def test_with_keys_any_host_is_answered(tmp_path, conn) -> None:
    config = Config.from_env({"TASKPORT_API_KEYS": "k:alice"}, redis_url="redis://fake", data_dir=tmp_path)
    client = create_app(config, conn=conn).test_client()
    assert client.get("/healthz", headers={"Host": "tasks.example.com"}).status_code == 200
