"""The machinery of taskport's Lua scripts (the scripts themselves: app.core.scripts).

:class:`Script` is a script with the table of what it takes: its KEYS and ARGV by name, in order, the one
home of their positions. It renders them into the Lua as a preamble (``local task = KEYS[1]`` ...), so a
body never spells a position, and builds a call's KEYS and ARGV from names (:meth:`Script.call`).

:func:`render` writes the markers a script body uses instead of literals: ``$PENDING`` (a
:class:`~app.core.states.TaskStatus`, ``$TAKEN`` or ``$MISSING_PAYLOAD``), ``$ACTIVE`` (a status set of
app.core.states, as a Lua table ``{['PENDING'] = true, ...}``), ``@status`` (a
:class:`~app.core.keys.TaskField`), ``%pending`` (a :class:`~app.core.keys.BatchField`), ``&submitted`` (a field
of ``keys.STATS``) or ``!task`` (an :class:`~app.core.audit.EntryField`), each from that one home; a name it
does not know fails at import.
:class:`Command` and :func:`replay` carry the RQ commands a script replays.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from operator import itemgetter
from typing import Any, NamedTuple

from app.core import keys as keyspace
from app.core.audit import EntryField
from app.core.ids import new_run_id
from app.core.keys import STAT_ENTERED, STAT_RECOVERED, STAT_RETRIED, STAT_SUBMITTED, BatchField, TaskField
from app.core.states import ACTIVE, CLAIM_TAKEN, MISSING_PAYLOAD, TERMINAL, TaskStatus

STATUS_WORDS = {**{s.name: s.value for s in TaskStatus}, "TAKEN": CLAIM_TAKEN, "MISSING_PAYLOAD": MISSING_PAYLOAD}
STATUS_SETS = {"ACTIVE": ACTIVE, "TERMINAL": TERMINAL}
FIELD_WORDS = {f.value: f.value for f in TaskField}
STAT_WORDS = {name: name for name in (STAT_SUBMITTED, STAT_RETRIED, STAT_RECOVERED, *STAT_ENTERED.values())}
ENTRY_WORDS = {f.value: f.value for f in EntryField}
BATCH_WORDS = {f.value: f.value for f in BatchField}
# ``%name`` takes two letters at least: ``'%d'`` and ``'%s'`` are Lua's own format and pattern items.
_MARKER = re.compile(r"([$@&!])([A-Za-z_0-9]+)|(%)([a-z][a-z_]+)")
_TABLES = {"$": STATUS_WORDS, "@": FIELD_WORDS, "&": STAT_WORDS, "!": ENTRY_WORDS, "%": BATCH_WORDS}


def _literal(sigil: str, name: str) -> str:
    if sigil == "$" and name in STATUS_SETS:
        return "{" + ", ".join(f"['{s}'] = true" for s in sorted(STATUS_SETS[name])) + "}"
    return f"'{_TABLES[sigil][name]}'"


def render(source: str) -> str:
    """``source`` with every ``$STATUS`` (or status set), ``@field``, ``&stat`` and ``!entry`` marker written
    as a Lua literal."""
    return _MARKER.sub(lambda m: _literal(m[1] or m[3], m[2] or m[4]), source)


# Lua's words, enough to find where a function ends and which names a script uses: a comment or a string (long ones
# too) is one token, so a word in it is neither a block keyword nor a reference; punctuation is skipped.
_LUA_TOKEN = re.compile("|".join((
    r"[A-Za-z_][A-Za-z_0-9]*",  # a word first: the most of them, and nothing else starts with a letter
    r"--\[(=*)\[.*?\]\1\]", r"--[^\n]*", r"\[(=*)\[.*?\]\2\]",  # comments, long strings
    r"'(?:\\.|[^'\\\n])*'", r'"(?:\\.|[^"\\\n])*"')), re.S)
_OPENS = frozenset(("function", "if", "do", "repeat"))  # ``while``/``for`` open with their ``do``
_CLOSES = frozenset(("end", "until"))


@cache
def prune(source: str) -> str:
    """``source`` without each ``local function NAME`` that nothing else in it names, again until none is left
    (a function only an unused one called goes too). A script is assembled from shared fragments (the audit, the
    replay, the create...) and runs them whole on every call: under EVAL/EVALSHA each ``local function`` is a new
    closure per call, so one a script never calls is Lua work per call for nothing (bench/README.md, "Lua per
    call"). A name defined more than once is left alone; a word in a string or a comment is no reference."""
    tokens = [(m.start(), m.end(), m.group()) for m in _LUA_TOKEN.finditer(source)]
    words = [t[2] for t in tokens]
    spans: dict[str, list[tuple[int, int]]] = {}  # each function's name -> where it is, from ``local`` to ``end``
    for i in range(len(words) - 2):
        if words[i] == "local" and words[i + 1] == "function":
            spans.setdefault(words[i + 2], []).append((i, _block_end(words, i + 1)))
    total, gone, cut = Counter(words), [False] * len(words), []
    changed = True
    while changed:
        changed = False
        for name, [(start, end), *more] in spans.items():
            if more or gone[start] or sum(1 for j in range(start, end + 1) if words[j] == name and not gone[j]) \
                    != total[name]:
                continue  # defined twice, gone already, or named somewhere else
            for j in range(start, end + 1):
                if not gone[j]:
                    gone[j] = True
                    total[words[j]] -= 1
            cut.append((tokens[start][0], tokens[end][1]))
            changed = True
    for begin, finish in sorted(cut, reverse=True):
        if not any(b < begin and finish <= f for b, f in cut):  # one inside another that went: cut with it
            source = source[:begin] + source[finish:].removeprefix("\n")
    return source


def _block_end(words: Sequence[str], at: int) -> int:
    """The index of the ``end`` that closes the block opened by ``words[at]``."""
    depth = 0
    for j in range(at, len(words)):
        if words[j] in _OPENS:
            depth += 1
        elif words[j] in _CLOSES:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("a Lua block without its end")


class Command(NamedTuple):
    """One Redis command on one key, for a script to replay (see SUBMIT): how the job layer hands over
    the commands that queue a job, so that they run inside the script that creates the task."""

    name: str
    key: str
    args: tuple[Any, ...]


def replay(commands: Iterable[Command]) -> tuple[list[str], list[Any]]:
    """``commands`` as SUBMIT takes them: (their keys, then [name, argc, args...] per command)."""
    keys_: list[str] = []
    args: list[Any] = []
    for command in commands:
        keys_.append(command.key)
        args += [command.name, len(command.args), *command.args]
    return keys_, args


class Tail(NamedTuple):
    """A variadic tail of a script's KEYS or ARGV (after its named ones): its name and what it holds."""

    name: str
    meaning: str


# The audit stream: every script's last key, after its named keys and any tail (TaskStore.run_script appends
# keys.AUDIT to every call). The preamble names it; the audit fragment (AUDIT) writes to it.
AUDIT_STREAM = "audit_stream"
_LUA_WORDS = frozenset("and break do else elseif end false for function if in local nil not or repeat return "
                       "then true until while".split())
_NAME = re.compile(r"[a-z_][a-z_0-9]*")


# A script that is not safe to run twice by construction records its answer under a call id of its own, in the
# same atomic step as its writes, and answers a repeat of the call from that record without writing again: a
# reply lost to a Redis restart, a failover, a stall or a blip makes redis-py send the same call again (the
# same KEYS and ARGV, so the same call id). ONCE_KEY is such a script's first key (keys.call(its call id)) and
# ONCE_ARG its first argument: how long the record lives, in ms ('' = no record: a call its caller knows to be
# safe twice, such as a bare heartbeat). The record lives longer than any client keeps sending a call again
# (Config.call_record_ms). Only an answer that says the call wrote is kept: 1, {1, ...} (these scripts' "done"),
# a list of what it took (a claim) or $PROCESSING (a progress write). A call that wrote nothing (0, {0, ...},
# a refusal {2, ...}, an empty list, the status a compare-and-set found) leaves nothing: its repeat is a first
# call, answered from the state it finds then, which is the only answer its caller sees. Answers are kept as
# JSON (cjson: every script answers arrays of strings, integers and false), so a repeat gets the first reply.
#
# Where the record is read: FIRST, before the body runs, for a script whose repeat would write again (a
# progress write appends its checkpoint line while the run holds the task; a batch create finds its own dedup
# keys held and would count them again). LATE, only once the body wrote nothing, for a compare-and-set that a
# repeat always fails because the first call moved what it compares (a transition's expected statuses never
# include the one it moves to; a submit finds its own dedup key held): the usual call, which writes, then
# costs no read.
# Every script's first line: a script that declares itself (Redis 7+, Valkey) is checked before it runs, and one
# that may write is refused whole (NOREPLICAS, OOM, READONLY) by a server that cannot take writes now. Without
# it the check comes at the first write, and a path that only reads answers from wherever it ran: after a
# partition heals, an old primary that has not yet learnt it was replaced answered a worker's start "gone",
# read from its stale data, and the job was dropped (tests/scale/test_soak_bed.py). Refused, the call is a
# ConnectionError (app.core.connection.NoReplicaError): the client reconnects to the primary the Sentinels name.
SHEBANG = "#!lua\n"
ONCE_KEY = "call"
ONCE_ARG = "call_ttl_ms"
FIRST = "first"
LATE = "late"
_ONCE_HEAD = {FIRST: """
local once_recorded = call_ttl_ms ~= '' and redis.call('GET', call)
if once_recorded then return cjson.decode(once_recorded) end
""", LATE: ""}
_ONCE_TAIL = """
local once_answer = once_body()
local once_wrote = once_answer == 1 or once_answer == $PROCESSING
if type(once_answer) == 'table' then
  local first = once_answer[1]
  once_wrote = first ~= nil and (type(first) ~= 'number' or first == 1)
end
if call_ttl_ms == '' then return once_answer end
if once_wrote then
  redis.call('SET', call, cjson.encode(once_answer), 'PX', call_ttl_ms)
elseif __LATE__ then
  local once_recorded = redis.call('GET', call)
  if once_recorded then return cjson.decode(once_recorded) end
end
return once_answer
"""


class ScriptCallError(TypeError):
    """A script called with a missing or unknown key or argument name (or a tail it does not take)."""


@dataclass(frozen=True, eq=False)
class Script:
    """One Lua script and the table of what it takes: ``keys`` and ``args`` map each name, in KEYS / ARGV
    order, to a line on what it is; ``rest_keys`` / ``rest`` name a variadic tail after them, if any.

    The preamble :meth:`source` renders from the table binds ``local <name> = KEYS[i]`` / ``ARGV[i]``, a tail
    of keys as a table ``local <name> = {...}`` and a tail of arguments as its first index
    ``local first_<name> = i``, and :data:`AUDIT_STREAM`; the body uses these names only.
    """

    name: str
    keys: Mapping[str, str]
    args: Mapping[str, str]
    body: str
    rest_keys: Tail | None = None
    rest: Tail | None = None
    once: str = ""  # not safe twice by construction: a call records its answer, read FIRST or LATE (see ONCE_KEY)
    _key_names: frozenset[str] = field(init=False, repr=False)
    _arg_names: frozenset[str] = field(init=False, repr=False)
    _take_keys: Callable[[Mapping[str, Any]], tuple[Any, ...]] = field(init=False, repr=False)
    _take_args: Callable[[Mapping[str, Any]], tuple[Any, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = [*self._once_names(), *self.keys, *self.args, AUDIT_STREAM, *(t.name for t in (self.rest_keys,) if t),
                 *(f"first_{t.name}" for t in (self.rest,) if t)]
        bad = [n for n in names if not _NAME.fullmatch(n) or n in _LUA_WORDS]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"script {self.name}: names must be distinct Lua identifiers, not {bad or names}")
        object.__setattr__(self, "_key_names", frozenset(self.keys))
        object.__setattr__(self, "_arg_names", frozenset(self.args))
        object.__setattr__(self, "_take_keys", _getter(tuple(self.keys)))
        object.__setattr__(self, "_take_args", _getter(tuple(self.args)))

    def _once_names(self) -> tuple[str, ...]:
        return (ONCE_KEY, ONCE_ARG) if self.once else ()

    @property
    def key_names(self) -> list[str]:
        """Every named key in KEYS order: a ``once`` script's ONCE_KEY first, then the table's."""
        return [*self._once_names()[:1], *self.keys]

    @property
    def arg_names(self) -> list[str]:
        """Every named argument in ARGV order: a ``once`` script's ONCE_ARG first, then the table's."""
        return [*self._once_names()[1:], *self.args]

    def preamble(self) -> str:
        """The Lua that binds every name of the table to its position (the only place a position is spelt); a
        ``once`` script's ONCE_KEY and ONCE_ARG come first."""
        return self._once_preamble() + self._table_preamble()

    def _once_preamble(self) -> str:
        return f"local {ONCE_KEY} = KEYS[1]\nlocal {ONCE_ARG} = ARGV[1]\n" if self.once else ""

    def _table_preamble(self) -> str:
        """The preamble less a ``once`` script's ONCE_KEY and ONCE_ARG."""
        key_names, arg_names = self.key_names, self.arg_names
        skip = 1 if self.once else 0
        lines = [f"local {name} = KEYS[{i}]" for i, name in enumerate(key_names, 1) if i > skip]
        if self.rest_keys:  # copied one by one: unpack() fails past ~8,000 values (a batch's keys)
            name = self.rest_keys.name
            lines.append(f"local {name} = {{}}")
            lines.append(f"for i = {len(key_names) + 1}, #KEYS - 1 do {name}[i - {len(key_names)}] = KEYS[i] end")
        lines.append(f"local {AUDIT_STREAM} = KEYS[#KEYS]")
        lines += [f"local {name} = ARGV[{i}]" for i, name in enumerate(arg_names, 1) if i > skip]
        if self.rest:
            lines.append(f"local first_{self.rest.name} = {len(arg_names) + 1}")
        return "\n".join(lines) + "\n"

    def source(self, fragment: str = "") -> str:
        """The script as Redis runs it: the SHEBANG, the preamble, then ``fragment`` (the audit function), then
        the body, markers rendered, without the functions it never calls (:func:`prune`).

        A ``once`` script's body runs as a function (``once_body``: its answer is recorded), with the preamble and
        the fragment inside it, its own locals: a Lua closure costs a step per name it takes from outside
        (an upvalue) each time it is made, which is every call, and a body that took the whole preamble from
        outside (TRANSITION: ~40 names) cost ~1.5 µs of Redis CPU a call for it (bench/README.md, "A delivery,
        third round"). Only ONCE_KEY and ONCE_ARG, which the record's head and tail read, are bound outside."""
        if not self.once:
            return prune(SHEBANG + self.preamble() + fragment + render(self.body))
        late = "true" if self.once == LATE else "false"
        body = (_ONCE_HEAD[self.once] + "local function once_body()\n" + self._table_preamble() + fragment
                + render(self.body) + "\nend\n" + render(_ONCE_TAIL).replace("__LATE__", late))
        return prune(SHEBANG + self._once_preamble() + body)

    def call(self, keys: Mapping[str, str], args: Mapping[str, Any], rest_keys: Sequence[str] = (),
             rest: Sequence[Any] = (), *, record_ms: int | str = "") -> tuple[list[str], list[Any]]:
        """(KEYS, ARGV) of a call, from ``keys`` and ``args`` by name (the audit stream not included: see
        :data:`AUDIT_STREAM`), ``rest_keys`` / ``rest`` after them. Raises ScriptCallError, naming them, when a
        name is missing or unknown or a tail is passed to a script that takes none. A submit's hot path:
        the only check is a comparison of name sets.

        A ``once`` script's call gets a fresh call id and keeps its answer ``record_ms`` ('' = not kept): see
        ONCE_KEY. Its ONCE_KEY and ONCE_ARG are filled in here, never by the caller."""
        if keys.keys() != self._key_names or args.keys() != self._arg_names or (rest_keys and not self.rest_keys) \
                or (rest and not self.rest):
            raise self._refusal(keys, args, bool(rest_keys), bool(rest))
        if self.once:
            call = keyspace.call(new_run_id() if record_ms != "" else "")
            return [call, *self._take_keys(keys), *rest_keys], [record_ms, *self._take_args(args), *rest]
        return [*self._take_keys(keys), *rest_keys], [*self._take_args(args), *rest]

    def _refusal(self, keys: Mapping[str, str], args: Mapping[str, Any], rest_keys: bool,
                 rest: bool) -> ScriptCallError:
        wrong = {"missing keys": self._key_names - keys.keys(), "unknown keys": keys.keys() - self._key_names,
                 "missing args": self._arg_names - args.keys(), "unknown args": args.keys() - self._arg_names}
        said = [f"{what} {sorted(names)}" for what, names in wrong.items() if names]
        said += ["it takes no tail of keys"] if rest_keys and not self.rest_keys else []
        said += ["it takes no tail of args"] if rest and not self.rest else []
        return ScriptCallError(f"script {self.name}: " + "; ".join(said))


def _getter(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` in a mapping, in that order, as a tuple (operator.itemgetter: fast)."""
    return itemgetter(*names) if len(names) > 1 else lambda mapping: tuple(mapping[n] for n in names)
