"""app.core.lua.prune: a script carries only the Lua functions it calls (each ``local function`` is a closure made
on every call of the script; bench/README.md "Lua per call (issue 32)")."""

from __future__ import annotations

import re

import pytest

from app.core import callbacks, jobclaims, schedule_scripts, scripts
from app.core.config import Config
from app.core.lua import SHEBANG, Script, prune

_DEFINED = re.compile(r"local function ([A-Za-z_][A-Za-z_0-9]*)")


def unused_functions(source: str) -> list[str]:
    """The ``local function`` names a source never names again: an independent, plain-text check (a name in a
    comment or a string counts as used here, so this finds fewer than prune drops, never more)."""
    return [name for name in _DEFINED.findall(source)
            if len(re.findall(rf"\b{name}\b", source)) == 1]


def every_source() -> dict[str, str]:
    """Every script as a store loads it: taskport's with the audit fragment (both trims on), the others alone."""
    others = (*jobclaims.SCRIPTS.values(), *callbacks.SCRIPTS, *schedule_scripts.SCRIPTS.values())
    return {**scripts.build(1000, 3600), **scripts.build(*Config().audit_limits),
            **{f"{s.name} ({type(s).__module__})": s.source() for s in others}}


@pytest.mark.parametrize("name", sorted(every_source()))
def test_no_script_carries_a_function_it_never_calls(name: str) -> None:
    assert unused_functions(every_source()[name]) == []


def test_the_submit_carries_none_of_the_batch_s_or_the_trim_s_functions() -> None:
    """What the submit defined on every call and never used (bench/README.md "Submit, fifth pass")."""
    source = scripts.build(1000, 3600)["submit"]
    defined = set(_DEFINED.findall(source))
    assert defined.isdisjoint({"fold_start", "fold_writes", "fold_line", "fold_lines", "audit_trim", "audit"})
    assert {"create", "replay", "audit_values", "put_in_line"} <= defined
    assert "audit_entry" not in defined  # the create passes its values, no table
    assert {"fold_line", "fold_lines", "audit_trim"} <= set(_DEFINED.findall(scripts.build(1000, 3600)["batch_create"]))


def test_a_dropped_function_goes_whole_with_its_inner_blocks_and_what_only_it_called() -> None:
    source = SHEBANG + """local function helper(x)
  return x .. 'end'  -- an end in a comment, 'function' in a string
end
local function unused(t)
  for _, v in ipairs(t) do
    if v then repeat v = helper(v) until v == "until end" elseif v == nil then while true do break end end
  end
  local function inner() return [[ end end ]] end
  return function() return inner() end
end
local function used(a)
  if a then return a end
end
return used(ARGV[1])
"""
    assert prune(source) == SHEBANG + """local function used(a)
  if a then return a end
end
return used(ARGV[1])
"""


def test_a_name_in_a_string_or_comment_is_no_call_and_a_name_defined_twice_stays() -> None:
    source = ("local function gone() end\nlocal function twice() end\nlocal function twice() end\n"
              "return 'gone' -- gone\n")
    assert prune(source) == "local function twice() end\nlocal function twice() end\nreturn 'gone' -- gone\n"


def test_a_function_called_only_from_itself_goes() -> None:
    assert prune("local function loop(n) if n > 0 then return loop(n - 1) end end\nreturn 1\n") == "return 1\n"


def test_the_script_source_is_pruned() -> None:
    script = Script("t", keys={}, args={"x": "x"}, body="local function never() end\nreturn x\n")
    assert "never" not in script.source()
