"""The hot verbs' two command-line readers agree: the fast parser (:func:`options.parse`) and
the typer command made from the same table (:func:`typed.command`) hand the implementation the
same ``params`` for every option of every table, in every spelling click accepts; where the
fast parser is not sure (``--help``, a typo, a bad integer, a flag cluster) it declines, and
typer answers as before. Not timed: the CPU figures are in ``benchmarks/bench_cli_startup.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpupool.cli import hot, options
from gpupool.cli.options import Arg, Opt, Param
from gpupool.cli.typed import command

TABLES = {verb: (table, inter) for verb, (table, inter) in hot.HOT.items()}


def typer_reads(table: tuple[Param, ...], argv: list[str], interspersed: bool) -> Any:
    """What the typer command made from ``table`` hands its body for ``argv`` (or its exit)."""
    got: list[dict[str, Any]] = []
    app = typer.Typer(add_completion=False)
    app.command(context_settings={"allow_interspersed_args": interspersed})(
        command("probe", "A probe.", table, got.append)
    )

    @app.callback()
    def _root() -> None:
        """A group, so the command is called by name."""

    result = CliRunner().invoke(app, ["probe", *argv])
    if result.exit_code != 0:
        return ("exit", result.exit_code)
    return got[0]


def _value(opt: Opt) -> tuple[str, Any]:
    """A sample value for ``opt`` as typed, and as the command receives it."""
    if opt.kind is int:
        return "3", 3
    if opt.kind == "path":
        return "some/dir", Path("some/dir")
    return "x=1,y", "x=1,y"


def _spellings(opt: Opt) -> list[tuple[list[str], Any]]:
    """Every way click reads ``opt`` given once: (argv, the value it sets)."""
    out: list[tuple[list[str], Any]] = []
    if opt.flag:
        out += [([f], True) for f in opt.flags] + [([f], False) for f in opt.off]
        return out
    typed, value = _value(opt)
    want = [value] if opt.many else value
    for flag in opt.flags:
        out.append(([flag, typed], want))
        out.append(([f"{flag}={typed}" if flag.startswith("--") else flag + typed], want))
    return out


def _base(verb: str) -> list[str]:
    """The positional arguments a verb needs for its command line to be whole."""
    return {"show": ["job1"], "submit": []}.get(verb, [])


CASES = [
    (verb, spelled, value, opt.dest)
    for verb, (table, _) in TABLES.items()
    for opt in table
    if isinstance(opt, Opt)
    for spelled, value in _spellings(opt)
]


@pytest.mark.parametrize(("verb", "argv", "value", "dest"), CASES)
def test_each_option_in_each_spelling_reads_the_same_both_ways(
    verb: str, argv: list[str], value: Any, dest: str
) -> None:
    table, inter = TABLES[verb]
    line = [*argv, *_base(verb)] if verb != "submit" else [*argv, "--", "true"]
    fast = options.parse(table, line, interspersed=inter)
    assert fast is not None, line
    assert fast[dest] == value
    assert fast == typer_reads(table, line, inter)


@pytest.mark.parametrize(
    ("verb", "argv"),
    [
        ("submit", ["-J", "a", "-g", "0.5", "-e", "A=1", "-e", "B=2", "--", "python", "-c", "x"]),
        ("submit", ["-g", "1", "python", "train.py", "--epochs", "3", "-g", "2"]),
        ("submit", ["--gpu-type", "A100", "--gpu-type", "H100", "--no-preemptible", "--wrap", "x"]),
        ("submit", ["--hold", "-a", "0-9", "-q", "high", "-t", "1:00:00", "--", "-"]),
        ("queue", ["-t", "PD", "-t", "R", "--me", "-u", "bob", "-p", "research"]),
        ("queue", []),
        ("cancel", ["a1", "-u", "alice", "b2", "--reason", "wrong data", "-t", "PD"]),
        ("cancel", ["-n", "sweep", "--", "-x"]),
        ("show", ["--json", "5d4c_3"]),
        ("show", ["job1", "--server", "http://h:1", "--token", "t"]),
    ],
)
def test_whole_command_lines_read_the_same_both_ways(verb: str, argv: list[str]) -> None:
    table, inter = TABLES[verb]
    fast = options.parse(table, argv, interspersed=inter)
    assert fast is not None
    assert fast == typer_reads(table, argv, inter)


@pytest.mark.parametrize(
    ("verb", "argv"),
    [
        ("queue", ["--help"]),
        ("queue", ["--bogus"]),
        ("queue", ["-u"]),  # a value is missing
        ("submit", ["--replicas", "two", "--", "true"]),
        ("submit", ["-Hq", "high", "--", "true"]),  # a cluster of short flags
        ("submit", ["--hold=yes", "--", "true"]),
        ("show", []),  # the job id is missing
        ("show", ["a", "b"]),  # one too many
        ("queue", ["extra"]),
    ],
)
def test_the_fast_parser_declines_what_typer_must_answer(verb: str, argv: list[str]) -> None:
    table, inter = TABLES[verb]
    assert options.parse(table, argv, interspersed=inter) is None


def test_every_option_of_a_table_is_in_its_help() -> None:
    for verb, (table, inter) in TABLES.items():
        app = typer.Typer(add_completion=False)
        app.command(context_settings={"allow_interspersed_args": inter})(
            command(verb, "Help.", table, lambda params: None)
        )
        shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
        for p in table:
            if isinstance(p, Opt):
                for flag in (*p.flags, *p.off):
                    assert flag in shown, f"{verb} {flag}"
            else:
                assert isinstance(p, Arg)
                assert p.dest.upper() in shown.upper(), f"{verb} {p.dest}"
