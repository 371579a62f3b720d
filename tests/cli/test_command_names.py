"""Every ``gpupool`` command that any message, help text or docstring names exists.

A user who hit "node 'x' not found: list nodes with `gpupool node list`" got "No such command
'node'" for following the advice. This test reads every string in ``src/gpupool`` (messages,
help, docstrings), finds each ``gpupool WORDS`` in it, and checks it against the real typer app:
the first word must be a command and, where that command is a group, a second word must be one
of its sub-commands. Prose that starts with the product's name ("gpupool sets it per job") is
told apart by an explicit list of words that are not commands; a mention in backticks is
always a command.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.main import root_command, walk
from tests.cli.conftest import LocalPool

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"

#: Words that follow "gpupool" in prose, never as a command (outside backticks).
PROSE = frozenset(
    [
        "as",
        "bridge",
        "cannot",
        "claim",
        "claims",
        "class",
        "client",
        "container",
        "could",
        "devices",
        "does",
        "errors",
        "every",
        "for",
        "gives",
        "has",
        "home",
        "import",
        "is",
        "job",
        "keeps",
        "knows",
        "looked",
        "metric",
        "needs",
        "never",
        "on",
        "places",
        "plugin",
        "publishes",
        "raises",
        "region",
        "replay",
        "reports",
        "runs",
        "schedules",
        "schema",
        "sets",
        "slice",
        "status",
        "stopped",
        "stops",
        "store",
        "table",
        "usage",
        "user",
        "uses",
        "view",
        "was",
    ]
)

MENTION = re.compile(r"(?<![%\w/.-])(`?)gpupool ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def _strings() -> Iterator[tuple[str, int, str]]:
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield str(path.relative_to(SRC.parent)), node.lineno, node.value


def _commands() -> tuple[set[str], dict[str, set[str]]]:
    paths = [p for p, _ in walk(root_command())]
    top = {p for p in paths if " " not in p} | {"version"}
    subs: dict[str, set[str]] = {}
    for p in paths:
        if " " in p:
            group, _, rest = p.partition(" ")
            subs.setdefault(group, set()).add(rest.split()[0])
    return top, subs


def problems_in(text: str, top: set[str], subs: dict[str, set[str]]) -> list[str]:
    """The command names in ``text`` that do not exist."""
    wrong = []
    for m in MENTION.finditer(text):
        quoted, first, second = m.groups()
        if first not in top:
            if quoted or first not in PROSE:
                wrong.append(f"gpupool {first} (no such command)")
        elif first in subs and second is not None and second not in subs[first] and quoted:
            wrong.append(f"gpupool {first} {second} (no such sub-command)")
    return wrong


def test_every_command_named_in_a_message_exists() -> None:
    top, subs = _commands()
    wrong = [
        f"{where}:{line}: {problem}"
        for where, line, text in _strings()
        for problem in problems_in(text, top, subs)
    ]
    assert wrong == []


def test_the_command_a_not_found_error_suggests_runs(pool_env: LocalPool, cli: Any) -> None:
    env = {"GPUPOOL_TOKEN": pool_env.admin_token}
    refused = cli("drain", "no-such-node", env=env)
    assert refused.exit_code == 3
    hint = re.search(r"`gpupool ([^`]+)`", refused.stderr)
    assert hint is not None, refused.stderr
    followed = cli(*hint.group(1).split(), env=env)
    assert followed.exit_code == 0, followed.stderr
    assert "sim-1" in followed.stdout


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("list nodes with `gpupool node list`", True),
        ("list nodes with `gpupool nodes`", False),
        ("create it with `gpupool tokens make`", True),
        ("`gpupool tokens create`", False),
        ("gpupool sets it per job", False),
        ("usage: %gpupool alloc 0.5", False),
        ("(gpupool frobnicate lists them)", True),
    ],
)
def test_the_scan_tells_commands_from_prose(text: str, found: bool) -> None:
    top, subs = _commands()
    assert bool(problems_in(text, top, subs)) is found
