"""Config: the one reader of the environment."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from app.core.config import Config, ConfigError
from app.launch.cli import main, web_command


def test_defaults_from_an_empty_environment() -> None:
    config = Config.from_env({})
    assert config.redis_url is None
    assert config.port == 8000
    assert config.data_dir == Path("var")
    assert config.redis_dir == Path("var/redis")
    assert config.results_dir == Path("var/results")
    assert config.backoff == [1, 5, 30]
    assert config.members == {}
    assert config.processor_modules == []


def test_values_are_parsed_to_the_type_of_their_default() -> None:
    config = Config.from_env({
        "PORT": "9000", "TASKPORT_STALL_TIMEOUT": "2.5", "TASKPORT_DATA_DIR": "/srv/tp",
        "REDIS_URL": "redis://r:6379/1", "TASKPORT_WORKER_CLASS": "simple",
    })
    assert config.port == 9000
    assert config.stall_timeout == 2.5
    assert config.data_dir == Path("/srv/tp")
    assert config.redis_url == "redis://r:6379/1"
    assert config.worker_class == "simple"


def test_an_empty_variable_means_unset() -> None:
    assert Config.from_env({"PORT": "", "REDIS_URL": ""}) == Config.from_env({})


def test_unknown_variables_are_ignored() -> None:
    assert Config.from_env({"HOME": "/root", "TASKPORT_NOPE": "1"}) == Config.from_env({})


@pytest.mark.parametrize("env, problem", [
    ({"PORT": "eighty"}, "PORT must be an integer"),
    ({"TASKPORT_STALL_TIMEOUT": "soon"}, "TASKPORT_STALL_TIMEOUT must be a number"),
    ({"TASKPORT_WORKER_CLASS": "threads"}, "TASKPORT_WORKER_CLASS"),
    ({"TASKPORT_WEB_WORKER_CLASS": "sync"}, "TASKPORT_WEB_WORKER_CLASS"),
    ({"TASKPORT_MAX_STREAMS_PER_MEMBER": "0"}, "TASKPORT_MAX_STREAMS_PER_MEMBER must be positive"),
    ({"TASKPORT_SSE_MAX_MINUTES": "0"}, "TASKPORT_SSE_MAX_MINUTES must be positive"),
    ({"TASKPORT_WEB_CONNECTIONS": "-5"}, "TASKPORT_WEB_CONNECTIONS must be positive"),
    ({"TASKPORT_WEB_IO_TIMEOUT": "0"}, "TASKPORT_WEB_IO_TIMEOUT must be positive"),
    ({"TASKPORT_REDIS_FSYNC": "no"}, "TASKPORT_REDIS_FSYNC"),
    ({"TASKPORT_TASK_TTL": "0"}, "TASKPORT_TASK_TTL must be positive"),
    ({"TASKPORT_WORKERS": "-1"}, "TASKPORT_WORKERS must be positive"),
    ({"TASKPORT_WORKER_MAX_JOBS": "-5"}, "TASKPORT_WORKER_MAX_JOBS must be 0"),
    ({"TASKPORT_REDIS_TLS_VERIFY": "yes"}, "TASKPORT_REDIS_TLS_VERIFY must be required, optional or none"),
    ({"TASKPORT_LOG_LEVEL": "LOUD"}, "TASKPORT_LOG_LEVEL must be a level name"),
    ({"TASKPORT_RETRY_BACKOFF": "1,x"}, "TASKPORT_RETRY_BACKOFF"),
    ({"TASKPORT_API_KEYS": "k1:alice,k2"}, "key:member"),
])
def test_bad_values_raise_a_config_error_naming_the_variable(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Config.from_env(env)


def test_overrides_win_over_the_environment_and_are_validated() -> None:
    config = Config.from_env({"PORT": "9000", "TASKPORT_WORKERS": "3"}, port=1234)
    assert (config.port, config.workers) == (1234, 3)
    with pytest.raises(ConfigError):
        Config.from_env({}, worker_class="green")


def test_derived_settings() -> None:
    config = Config.from_env({
        "TASKPORT_API_KEYS": " k1:alice , k2:bob ,", "TASKPORT_PROCESSORS": "a.b, c ,",
        "TASKPORT_RETRY_BACKOFF": "", "TASKPORT_DATA_DIR": "/d",
    })
    assert config.members == {"k1": "alice", "k2": "bob"}
    assert config.processor_modules == ["a.b", "c"]
    assert config.backoff == [1, 5, 30]  # empty = unset = the default
    assert Config.from_env({}, retry_backoff=" ").backoff == [0]
    assert config.redis_dir == Path("/d/redis")


def test_child_environ_rebuilds_the_same_config() -> None:
    config = Config.from_env({
        "REDIS_URL": "redis://127.0.0.1:7000/0", "PORT": "8123", "TASKPORT_PROGRESS_INTERVAL": "0.05",
        "TASKPORT_DATA_DIR": "/tmp/x", "TASKPORT_API_KEYS": "k:m", "TASKPORT_WORKER_CLASS": "spawn",
    })
    env = config.child_environ()
    assert all(isinstance(v, str) for v in env.values())
    assert Config.from_env(env) == config


def test_child_environ_leaves_unset_values_out() -> None:
    assert "REDIS_URL" not in Config.from_env({}).child_environ()


def test_describe_lists_every_setting_once() -> None:
    rows = Config.describe()
    names = [env for env, _, _ in rows]
    assert len(rows) == len(fields(Config))
    assert len(set(names)) == len(names)
    assert all(name.startswith(("REDIS_", "TASKPORT_")) or name in ("PORT", "WEB_CONCURRENCY", "DYNO")
               for name in names)
    assert all(doc for _, _, doc in rows)
    assert ("PORT", "8000", "HTTP port of the web process") in rows


def test_taskport_config_defaults_prints_the_table_as_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--defaults"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| Variable | Default | Meaning |"
    assert len(lines) == 2 + len(fields(Config))
    assert any(line.startswith("| `REDIS_URL` | (unset) |") for line in lines)
    assert any(line.startswith("| `PORT` | `8000` |") for line in lines)


def test_workers_and_the_scheduler_get_none_of_the_webs_secrets() -> None:
    config = Config.from_env({"TASKPORT_API_KEYS": "k1:alice", "TASKPORT_DASHBOARD_PASSWORD": "s3cret",
                              "TASKPORT_TASK_TTL": "60"})
    web = config.child_environ("web")
    assert web["TASKPORT_API_KEYS"] == "k1:alice" and web["TASKPORT_DASHBOARD_PASSWORD"] == "s3cret"
    for role in ("worker", "scheduler"):
        env = config.child_environ(role)
        assert not {"TASKPORT_API_KEYS", "TASKPORT_DASHBOARD_PASSWORD", "TASKPORT_HOST"} & set(env)
        assert "k1" not in "".join(env.values()) and "s3cret" not in "".join(env.values())
        rebuilt = Config.from_env(env)  # still a valid Config: a worker starts with it
        assert rebuilt.task_ttl == 60


@pytest.mark.parametrize("raw, name", [("debug", "DEBUG"), ("Info", "INFO"), ("warn", "WARNING"),
                                       ("FATAL", "CRITICAL")])
def test_the_log_level_is_checked_once_and_named_as_logging_names_it(raw: str, name: str) -> None:
    config = Config.from_env({"TASKPORT_LOG_LEVEL": raw})
    assert config.log_level_name == name  # what the root logger, RQ and gunicorn (lower case) get
    web = web_command(config)
    assert web[web.index("--log-level") + 1] == name.lower()
