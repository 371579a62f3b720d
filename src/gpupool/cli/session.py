"""What every client command shares: the server options, the SDK client, errors and output.

Exit codes (also in ``gpupool --help`` of each command):

==  =====================================================================
0   success
1   the job (``run``) or a check (``precheck``) failed
2   invalid input: a bad size, an unknown option value, a job file problem
3   not found: no such job, node, tenant (another team's job is not found)
4   not allowed: missing or bad token, or the role may not do this
5   the server cannot be reached
6   conflict (e.g. the name exists, the job already ended)
7   the server failed (5xx)
8   timed out waiting
==  =====================================================================

Errors are one line on stderr, ``error: <what is wrong>: <what to do>``, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console, RenderableType

from gpupool.cli.fit import FitTable
from gpupool.cli.out import spec_problems
from gpupool.client.errors import EXIT_INVALID, ClientError
from gpupool.client.sdk import Client
from gpupool.domain.errors import GpupoolError, SpecError

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="server URL (default: $GPUPOOL_SERVER, gpupool login's file, then a local pool)",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="API token (default: $GPUPOOL_TOKEN, then as for --server)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for machines")]

# Job options shared by submit/run and update (sbatch / scontrol names).
QosOpt = Annotated[
    str | None, typer.Option("-q", "--qos", help="priority class, e.g. low, normal, high")
]
TimeOpt = Annotated[
    str | None, typer.Option("-t", "--time", help="time limit: 90 (minutes), 1:30:00, 2-12")
]
ExpectedOpt = Annotated[
    str | None, typer.Option("--expected", help="expected run time, for start estimates")
]
PreemptibleOpt = Annotated[
    bool | None, typer.Option("--preemptible/--no-preemptible", help="may be preempted")
]


def console() -> Console:
    """The console for tables: plain text, never squeezed, when not a terminal (pipes, tests)."""
    tty = sys.stdout.isatty()
    return Console(highlight=False, soft_wrap=False, width=None if tty else 400)


def render_text(renderable: RenderableType, width: int = 400) -> str:
    """``renderable`` as plain text, trailing spaces removed (pipes, golden files)."""
    if isinstance(renderable, FitTable):
        text = renderable.plain(width)  # the same text as rich's, without its per-row cost
        if text is not None:
            return text
    con = Console(width=width, highlight=False, soft_wrap=False, color_system=None)
    with con.capture() as cap:
        con.print(renderable)
    return "\n".join(line.rstrip() for line in cap.get().splitlines()) + "\n"


def emit(renderable: RenderableType) -> None:
    """Print a table: with colour in a terminal, as plain text otherwise; a fitted table
    through a pipe at its natural width (nothing cut, not even a reason past 400 columns)."""
    if sys.stdout.isatty():
        console().print(renderable)
    elif isinstance(renderable, FitTable):
        sys.stdout.write(render_text(renderable, max(400, renderable.natural_width())))
    else:
        sys.stdout.write(render_text(renderable))


def fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    """Print ``error: message`` and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def handle_errors(cli_options: bool = False) -> Iterator[None]:
    """Turn gpupool errors into one line on stderr and the right exit code."""
    try:
        yield
    except SpecError as exc:
        for line in spec_problems(exc, cli_options):
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    except ClientError as exc:
        raise fail(str(exc), int(exc.exit_code)) from None
    except GpupoolError as exc:
        raise fail(str(exc), EXIT_INVALID) from None


@contextmanager
def session(
    server: str | None, token: str | None, *, cli_options: bool = False
) -> Iterator[Client]:
    """An SDK client for one command, with errors handled as above."""
    with handle_errors(cli_options):
        client = Client(server, token)
        try:
            yield client
        finally:
            client.close()


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=True) + "\n")
