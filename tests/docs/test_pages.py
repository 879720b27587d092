"""The doc tests' own machinery (tests/docs/pages.py, shell.py): what becomes an example, and that a page whose
output drifted fails. `make test-docs` runs these first, before the pages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs.pages import difference, examples, files, python_command, transcript
from tests.docs.shell import Shell, ShellTimeout

PAGE = """
```sh
echo one
```
```
one
```

<!-- file: out/greeting.txt -->
```text
hello
```

<!-- not run: starts a stack -->
```sh
make up
```

```sh
X=2
```

```python
print("py")
```

A body, not the output of the block above:

```json
{"not": "output of anything"}
```

```console
$ echo $X
2
$ echo a; echo b
a
b
```
"""


def test_a_page_yields_its_examples_in_order_with_their_outputs() -> None:
    steps = [[(s.command, s.want) for s in found] for _, _, found in examples(PAGE)]
    assert steps == [[("echo one\n", "one\n")], [("X=2\n", "")],
                     [(python_command('print("py")\n'), "")],
                     [("echo $X", "2\n"), ("echo a; echo b", "a\nb\n")]]


def test_file_blocks_are_files_not_examples() -> None:
    assert list(files(PAGE)) == [("out/greeting.txt", "hello\n")]


def test_a_console_block_must_start_with_a_command() -> None:
    with pytest.raises(ValueError, match="must start with"):
        transcript("output\n$ echo\n")


@pytest.mark.parametrize(("want", "got"), [
    ("id: ...\nstatus COMPLETED\n", "id: 5deb43ff-f010\nstatus COMPLETED"),
    ("HTTP/1.1 200 OK\n...\nRetry-After: 1\n", "HTTP/1.1 200 OK\r\nDate: today\r\nRetry-After: 1\r\n"),
    ("│ a │   \n", "│ a │"),
    ("", "\n"),
])
def test_placeholders_crlf_and_trailing_whitespace_match(want: str, got: str) -> None:
    assert difference(want, got) is None


@pytest.mark.parametrize(("want", "got"), [
    ("status COMPLETED\n", "status FAILED\n"),
    ("id: ...\nexit 7\n", "id: 1\nexit 5\n"),
    ("", "something printed\n"),
    ("two\nlines\n", "two\n"),
])
def test_an_output_that_drifted_is_reported(want: str, got: str) -> None:
    report = difference(want, got)
    assert report is not None and got.strip() in report


def test_the_shell_keeps_state_between_blocks_and_stops_a_stuck_one(tmp_path: Path) -> None:
    shell = Shell(tmp_path, dict(os.environ))
    try:
        assert shell.run("X=5; f() { echo f$1; }", timeout=10) == ""
        assert shell.run("echo $X; f 2; echo err >&2", timeout=10) == "5\nf2\nerr\n"
        assert shell.run("cat; echo stdin is empty", timeout=10) == "stdin is empty\n"
        with pytest.raises(ShellTimeout, match="still running"):
            shell.run("echo started; sleep 30", timeout=1)
    finally:
        shell.close()
