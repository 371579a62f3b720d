"""Typer commands made from the option tables of :mod:`gpupool.cli.options`.

A hot verb's options are declared once, as data (see that module). :func:`command` turns a
table into the function typer reads: a signature with one ``Annotated[type, typer.Option(...)]``
parameter per entry, in the table's order, so ``--help`` lists exactly what the fast parser
accepts, and a command line the fast parser declines (``--help``, a typo, a bad integer) gets
typer's usual help and errors. The function passes the parsed values on as one ``params``
dict, the same dict :func:`gpupool.cli.options.parse` makes, to the command's one
implementation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.cli.options import Arg, Opt, Param


def _annotation(p: Param) -> Any:
    if isinstance(p, Arg):
        if p.many:
            return Annotated[list[str] | None, typer.Argument(help=p.help)]
        return Annotated[str, typer.Argument(help=p.help)]
    value: Any = {str: str, int: int, "path": Path, bool: bool}[p.kind]
    if p.many:
        value = list[value]
    if p.flag and not p.off:
        info = typer.Option(*p.flags, help=p.help, **p.typer)
        return Annotated[bool, info]
    declared = [f"{p.flags[-1]}/{p.off[-1]}", *p.flags[:-1]] if p.off else list(p.flags)
    info = typer.Option(*declared, help=p.help, **p.typer)
    return Annotated[value | None, info]


def signature(params: Sequence[Param]) -> inspect.Signature:
    """The typer-readable signature of a table."""
    out = []
    for p in params:
        default: Any = inspect.Parameter.empty if isinstance(p, Arg) and p.required else None
        if isinstance(p, Opt):
            default = p.default
        out.append(
            inspect.Parameter(
                p.dest, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_annotation(p)
            )
        )
    return inspect.Signature(out)


def command(
    name: str, doc: str, params: Sequence[Param], body: Callable[[dict[str, Any]], None]
) -> Callable[..., None]:
    """A typer command ``name`` with help ``doc`` and the options ``params``; it calls
    ``body(params_dict)``."""

    def run(**given: Any) -> None:
        body({p.dest: given.get(p.dest) for p in params})

    sig = signature(params)
    run.__name__ = name.replace("-", "_")
    run.__qualname__ = run.__name__
    run.__doc__ = doc
    run.__signature__ = sig  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in sig.parameters.values()}
    return run
