"""The ``gpupool`` typer app: one group over the command modules (the slow path of
:mod:`gpupool.cli.main`).

The commands are loaded lazily (see :mod:`gpupool.cli.commands`): this module imports typer and
the command table, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator

import typer

from gpupool import __version__
from gpupool.cli.commands import LazyGroup, click

app = typer.Typer(
    name="gpupool",
    help="gpupool: one shared pool over every GPU your team owns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)


@app.callback()
def root() -> None:
    """A callback, so that the app is a group of commands even before any is loaded."""


@app.command()
def version() -> None:
    """Print gpupool's version.

    Example: ``gpupool version``
    """
    typer.echo(__version__)


def root_command() -> LazyGroup:
    """The click group behind :data:`app` with every command loaded (for tests and tools)."""
    group = typer.main.get_command(app)
    assert isinstance(group, LazyGroup)
    group.load_all()
    return group


def walk(group: click.Command, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` as (``"nodes delete"``-style path, command)."""
    children: dict[str, click.Command] = getattr(group, "commands", {})
    for name, command in children.items():
        path = f"{prefix}{name}"
        yield path, command
        yield from walk(command, path + " ")
