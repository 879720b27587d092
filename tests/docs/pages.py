"""How a page's examples are read and checked: Sybil parses the markdown, these decide what runs.

A page shows its examples in three shapes, and each runs in the page's one shell (``tests/docs/shell.py``):

- a ``sh`` block followed by an output block (a fence with no language, ``json`` or ``text``, nothing but
  blank lines between them): the block runs as pasted, and what it prints must be the output block;
- a ``python`` block followed by an output block: the same, the block run as a script (``python3 -``);
- a ``console`` block, a transcript: each ``$ command`` line runs in turn, and what it prints must be the
  lines under it, up to the next ``$``.

A ``sh`` or ``python`` block with no output block must print nothing. Expected output is compared as
Sybil compares a doctest's (its ``OutputChecker``: trailing whitespace ignored) with ``ELLIPSIS``: ``...``
stands for what changes between runs (ids, times, timings) or what the page leaves out.

Two HTML comments, invisible on the rendered page, mark the blocks that are not examples to run:
``<!-- file: PATH -->`` before a block makes it the file PATH of the reader's directory (``receiver.py``,
``src/mypkg/tasks.py``, ``batch.json``), written before any page runs, and ``<!-- not run: REASON -->``
before a block leaves it out (``make up``: the doc tests start their own stacks, the same way).
"""

from __future__ import annotations

import doctest
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sybil import Document, Example, Region
from sybil.evaluators.doctest import OutputChecker
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

OUTPUT_LANGUAGES = ("", "json", "text")
RUN_LANGUAGES = ("sh", "python")
PYTHON_END = "__DOCS_PYTHON_END__"
DIRECTIVE = re.compile(r"<!--\s*(?P<name>file|not run):\s*(?P<value>.*?)\s*-->\s*\Z")
FLAGS = doctest.ELLIPSIS
CHECKER = OutputChecker()

# Runs one block in the page's shell and returns what it printed: (namespace, source, timeout) -> output.
Runner = Callable[[dict[str, Any], str, float], str]


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, its text, where it is, and the directive just before it."""

    language: str
    source: str
    start: int
    end: int
    directive: tuple[str, str] | None


@dataclass(frozen=True)
class Step:
    """One thing to run and what it must print (``want``, the page's text, placeholders included)."""

    command: str
    want: str


def blocks(document_text: str, lexer: Any = None) -> list[Block]:
    """Every fenced block of ``document_text`` in page order, each with the directive comment before it."""
    lexer = lexer or RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<language>[\w-]*)[ \t]*$\n", re.M))
    document = Document(document_text, "<page>")
    found = []
    for region in sorted(lexer(document), key=lambda r: r.start):
        before = document_text[:region.start].rstrip().rsplit("\n", 1)[-1]
        match = DIRECTIVE.search(before)
        found.append(Block(region.lexemes["language"], str(region.lexemes["source"]), region.start, region.end,
                           (match["name"], match["value"]) if match else None))
    return found


def files(document_text: str) -> Iterator[tuple[str, str]]:
    """The ``(path, content)`` of each block marked ``<!-- file: PATH -->``."""
    for block in blocks(document_text):
        if block.directive and block.directive[0] == "file":
            yield block.directive[1], block.source


def transcript(source: str) -> list[Step]:
    """A ``console`` block's ``$ command`` lines, each with the lines printed under it."""
    steps: list[Step] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:], ""))
        elif steps:
            steps[-1] = Step(steps[-1].command, steps[-1].want + line + "\n")
        else:
            raise ValueError(f"a console block must start with a '$ ' command: {line!r}")
    return steps


def python_command(source: str) -> str:
    """A python block as the shell runs it: the script on the interpreter's stdin, as ``python3 -`` reads it."""
    return f"python3 - <<'{PYTHON_END}'\n{source.rstrip()}\n{PYTHON_END}"


def examples(document_text: str) -> Iterator[tuple[int, int, list[Step]]]:
    """``(start, end, steps)`` for each example of a page, in page order (see the module's docstring)."""
    found = blocks(document_text)
    for index, block in enumerate(found):
        if block.directive or block.language not in (*RUN_LANGUAGES, "console"):
            continue
        if block.language == "console":
            yield block.start, block.end, transcript(block.source)
            continue
        output = found[index + 1] if index + 1 < len(found) else None
        paired = (output is not None and output.language in OUTPUT_LANGUAGES and output.directive is None
                  and not document_text[block.end:output.start].strip())
        command = python_command(block.source) if block.language == "python" else block.source
        yield block.start, (output.end if paired and output else block.end), [
            Step(command, output.source if paired and output else "")]


def difference(want: str, got: str) -> str | None:
    """None when ``got`` is what ``want`` shows (``...`` matching anything), else a report of both."""
    # HTTP headers end their lines with CRLF, which a terminal shows as plain line ends.
    want, got = want.rstrip("\n") + "\n", got.replace("\r\n", "\n").rstrip("\n") + "\n"
    if CHECKER.check_output(want, got, FLAGS):
        return None
    diff = CHECKER.output_difference(doctest.Example("", want), got, FLAGS | doctest.REPORT_UDIFF)
    return f"{diff}\nWhat it printed, in full:\n{got}"


class PageParser:
    """Sybil's parser for a page: a region per example, evaluated by running its steps with ``run``."""

    def __init__(self, run: Runner, timeout: float) -> None:
        self.run = run
        self.timeout = timeout

    def __call__(self, document: Document) -> Iterable[Region]:
        for start, end, steps in examples(document.text):
            yield Region(start, end, parsed=steps, evaluator=self.evaluate)

    def evaluate(self, example: Example) -> str | None:
        for step in example.parsed:
            got = self.run(example.namespace, step.command, self.timeout)
            wrong = difference(step.want, got)
            if wrong is not None:
                first, *more = step.command.splitlines()
                return f"`{first}`{' …' if more else ''}:\n{wrong}"
        return None


def write_files(pages: Iterable[Path], directory: Path) -> None:
    """Write every ``<!-- file: PATH -->`` block of ``pages`` under ``directory``, as a reader saves them."""
    for page in pages:
        for name, content in files(page.read_text()):
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
