"""The Lua scripts' tables (app.core.scripts.Script): the preamble, the calls built from names, and the
key layout every script runs on (one hash slot, so the layout stays Cluster-ready)."""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import fakeredis
import pytest
from redis.crc import key_slot

from app.core import callbacks, keys, lua, schedule_scripts, scripts
from app.core.answers import NewTask
from app.core.audit import EntryField
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.lua import AUDIT_STREAM, Script, ScriptCallError, Tail
from app.core.states import ACTIVE
from app.core.store import TaskStore
from tests.tour import tour

SCRIPTS = sorted(scripts.SCRIPTS.values(), key=lambda s: s.name)
OTHER_SCRIPTS = (*callbacks.SCRIPTS, *schedule_scripts.SCRIPTS.values())  # scripts of their own stores
# RQ's own keys: its set of queues, a queue, a job hash (what JobQueue.job_commands acts on)
RQ_KEY = re.compile(r"rq:(queues|queue:[^:]+|job:[^:]+)")


def new_task(member: str = "public") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type="demo.sleep", payload={"seconds": 0}, dedup_digest=task_id,
                   priority="default", max_attempts=2)


@pytest.fixture
def sent(conn: fakeredis.FakeRedis, config: Config) -> list[tuple[str, list[Any]]]:
    """Every EVALSHA sent on ``conn``: (the script's name, the keys it was passed)."""
    sources = {**scripts.build(*config.audit_limits), **{s.name: s.source() for s in OTHER_SCRIPTS}}
    names = {hashlib.sha1(source.encode()).hexdigest(): name for name, source in sources.items()}
    calls: list[tuple[str, list[Any]]] = []
    real = conn.evalsha

    def recording(sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        calls.append((names[sha], list(keys_and_args[:numkeys])))
        return real(sha, numkeys, *keys_and_args)

    conn.evalsha = recording  # type: ignore[method-assign]
    return calls


def test_every_script_s_keys_share_one_hash_slot(conn, config: Config, sent) -> None:
    """Every key taskport passes a script is on the slot of ``{tp}``, the prefix's hash tag, so a Cluster
    could run each script (it runs a script only on keys of one slot).

    Excluded, exactly: the tails of job command keys (``command_keys``), which are RQ's own
    (``rq:queues``, ``rq:queue:<name>``, ``rq:job:<id>``), written in the same script so that a task and its
    job land together. RQ does not run on a Redis Cluster, so that script's RQ keys are the one reason
    taskport targets one primary; asserted below to be RQ's and nothing else. (The one key a script builds
    itself, the submit's duplicate holder's hash, is a ``keys.task`` name: on the same slot.)
    """
    tour(TaskStore(conn, config), JobQueue(conn, config), conn)

    slot = key_slot(keys.PREFIX.encode())
    names = {s.name: s for s in (*SCRIPTS, *OTHER_SCRIPTS)}
    seen: set[str] = set()
    for name, passed in sent:
        script = names[name]
        seen.add(name)
        named, tail, audit_stream = passed[:len(script.key_names)], passed[len(script.key_names):-1], passed[-1]
        assert audit_stream == keys.AUDIT
        assert not tail or script.rest_keys is not None
        assert all(RQ_KEY.fullmatch(key) or key_slot(key.encode()) == slot for key in tail), tail
        assert {key: key_slot(key.encode()) for key in [*named, audit_stream]} == \
            {key: slot for key in [*named, audit_stream]}
    assert seen == set(names)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_the_preamble_binds_the_table_s_names_in_order(script: Script) -> None:
    preamble = script.preamble()
    bound = [(n, str(i)) for i, n in enumerate(script.key_names, 1)]
    assert re.findall(r"local (\w+) = KEYS\[(\d+)\]", preamble) == bound
    taken = [(n, str(i)) for i, n in enumerate(script.arg_names, 1)]
    assert re.findall(r"local (\w+) = ARGV\[(\d+)\]", preamble) == taken
    assert f"local {AUDIT_STREAM} = KEYS[#KEYS]" in preamble  # the last key, after any tail
    if script.rest:
        assert f"local first_{script.rest.name} = {len(script.arg_names) + 1}" in preamble
    if script.rest_keys:
        name = script.rest_keys.name  # copied key by key (unpack fails past ~8,000 values: a batch's keys)
        n = len(script.key_names)
        assert f"for i = {n + 1}, #KEYS - 1 do {name}[i - {n}] = KEYS[i] end" in preamble
    assert all(meaning.strip() for meaning in [*script.keys.values(), *script.args.values()])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_no_script_body_spells_a_position(script: Script) -> None:
    """Positions live in the rendered preamble only, so they cannot creep back into a body."""
    for text in (script.body, scripts.AUDIT):
        assert "KEYS[" not in text and "ARGV[" not in text
        assert "#KEYS" not in text and "#ARGV" not in text
    source = scripts.ALL[script.name]
    tail = 1 if script.rest_keys else 0  # the tail's copy loop reads KEYS[i]
    assert source.count("KEYS[") == len(script.key_names) + 1 + tail and source.count("ARGV[") == len(script.arg_names)
    redeclared = [n for n in [*script.keys, *script.args] if re.search(rf"\blocal\s+([\w,\s]*\b)?{n}\b", script.body)]
    assert redeclared == []  # a body's local must not shadow a name of the table


def test_the_preamble_and_the_call_agree_when_redis_runs_them() -> None:
    """A call built from names, run by Lua: each name of the body holds the value passed under it."""
    probe = Script("probe", keys={"first": "a key", "second": "another"}, args={"x": "an argument", "y": "another"},
                   rest_keys=Tail("extra_keys", "more keys"), rest=Tail("more", "more arguments"),
                   body="return {first, second, extra_keys[1], extra_keys[2], audit_stream, x, y,"
                        " first_more, unpack(ARGV, first_more)}")
    keys_, args = probe.call(keys={"second": "k2", "first": "k1"}, args={"y": "vy", "x": "vx"},
                             rest_keys=["k3", "k4"], rest=["m1", "m2"])
    conn = fakeredis.FakeRedis()
    answer = conn.eval(probe.source(), len(keys_) + 1, *keys_, "k-audit", *args)
    assert [a.decode() if isinstance(a, bytes) else a for a in answer] == \
        ["k1", "k2", "k3", "k4", "k-audit", "vx", "vy", 3, "m1", "m2"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_a_call_with_a_missing_or_unknown_name_is_refused(script: Script) -> None:
    keys_ = {name: f"{keys.PREFIX}{name}" for name in script.keys}
    args = {name: i for i, name in enumerate(script.args)}
    built = script.call(keys=keys_, args=args)
    once = len(script.key_names) - len(script.keys)  # a once script's call record comes first (lua.ONCE)
    assert (built[0][once:], built[1][once:]) == (list(keys_.values()), list(args.values()))
    missing_key, missing_arg = next(iter(script.keys)), list(script.args)[-1]
    with pytest.raises(ScriptCallError, match=rf"script {script.name}: missing keys \['{missing_key}'\]"):
        script.call(keys={k: v for k, v in keys_.items() if k != missing_key}, args=args)
    with pytest.raises(ScriptCallError, match=rf"missing args \['{missing_arg}'\]"):
        script.call(keys=keys_, args={k: v for k, v in args.items() if k != missing_arg})
    with pytest.raises(ScriptCallError, match=r"unknown keys \['colour'\]"):
        script.call(keys={**keys_, "colour": "x"}, args=args)
    with pytest.raises(ScriptCallError, match=r"unknown args \['colour'\]"):
        script.call(keys=keys_, args={**args, "colour": 1})
    if script.rest is None:
        with pytest.raises(ScriptCallError, match="it takes no tail of args"):
            script.call(keys=keys_, args=args, rest=["field", "value"])
    if script.rest_keys is None:
        with pytest.raises(ScriptCallError, match="it takes no tail of keys"):
            script.call(keys=keys_, args=args, rest_keys=["rq:queues"])


def test_a_table_s_names_are_distinct_lua_identifiers() -> None:
    with pytest.raises(ValueError, match="distinct Lua identifiers"):
        Script("bad", keys={"end": "a Lua keyword"}, args={}, body="")
    with pytest.raises(ValueError, match="distinct Lua identifiers"):
        Script("bad", keys={"task": "a key"}, args={"task": "the same name"}, body="")
    with pytest.raises(ValueError, match="distinct Lua identifiers"):
        Script("bad", keys={AUDIT_STREAM: "the audit stream's own name"}, args={}, body="")


def test_status_sets_are_rendered_from_states() -> None:
    rendered = lua.render("$ACTIVE")
    assert set(re.findall(r"\['(\w+)'\] = true", rendered)) == set(ACTIVE)
    for script in SCRIPTS:  # no line of a body compares a status with two members of a set by hand
        for line in script.body.splitlines():
            for members in lua.STATUS_SETS.values():
                assert sum(len(re.findall(rf"[=~]= \${s.name}\b", line)) for s in members) < 2, line


def test_the_audit_entry_s_fields_come_from_audit_py(store: TaskStore, conn) -> None:
    assert not set(re.findall(r"'(\w+)'", scripts.AUDIT)) & set(EntryField)  # written as !markers
    task = new_task()
    store.create(task)
    [(_, fields)] = conn.xrange(keys.AUDIT)
    assert [f.decode() for f in fields] == list(EntryField)  # every field, in the table's order
