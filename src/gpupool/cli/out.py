"""Errors and output of the hot verbs, without typer or rich (see :mod:`gpupool.cli.hot`).

The same words and exit codes as :mod:`gpupool.cli.session` (which the other commands use):
one line ``error: <what is wrong>: <what to do>`` on stderr, the exit codes listed there. An
error leaves as :class:`SystemExit`, which typer (the slow path, ``CliRunner`` in tests) passes
through unchanged and the fast path turns into the process's exit status.

:func:`emit_table` prints a :class:`~gpupool.cli.fit.FitTable` as :func:`session.emit
<gpupool.cli.session.emit>` does, through a pipe at its natural width, in a terminal at the
terminal's width with a bold header, in time linear in its cells; a table only rich can lay
out (one that does not fit even after every move) is handed to rich, imported then.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from gpupool.client.errors import EXIT_INVALID, ClientError
from gpupool.domain.errors import GpupoolError, SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupool.cli.fit import FitTable

BOLD, RESET = "\x1b[1m", "\x1b[0m"


#: Job-file keys and the ``submit`` option that sets each, for error messages.
OPTION_NAMES: dict[str, str] = {
    "name": "-J/--job-name",
    "command": "the command after --",
    "script": "--wrap",
    "resources.gpus": "-g/--gpus",
    "resources.gpu_memory": "--gpu-mem",
    "resources.gpu_types": "--gpu-type",
    "resources.cpus": "-c/--cpus",
    "resources.memory": "--mem",
    "pool": "-p/--pool",
    "tenant": "-A/--account",
    "priority": "-q/--qos",
    "time_limit": "-t/--time",
    "expected_duration": "--expected",
    "replicas": "--replicas",
    "checkpoint.signal": "--checkpoint-signal",
    "checkpoint.grace": "--grace",
    "isolation": "--isolation",
    "max_restarts": "--max-restarts",
    "workdir": "--workdir",
    "output": "-o/--output",
    "error": "--error",
    "time_min": "--time-min",
    "constraint": "-C/--constraint",
    "mail_type": "--mail-type",
    "mail_user": "--mail-user",
}


def spec_problems(exc: SpecError, cli: bool) -> Iterator[str]:
    """The lines of a spec error; ``cli``: keys named as ``submit``'s options."""
    for p in exc.problems:
        if cli and p.source is None:
            name = f"-e {p.key[4:]}" if p.key.startswith("env.") else OPTION_NAMES.get(p.key, p.key)
            yield f"{name}: {p.message}"
        else:
            yield str(p)


def echo(text: str, *, err: bool = False) -> None:
    """``text`` and a newline on stdout (or stderr), as ``typer.echo`` writes it."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def fail(message: str, code: int = EXIT_INVALID) -> SystemExit:
    """Print ``error: message`` and return the exit to raise."""
    echo(f"error: {message}", err=True)
    return SystemExit(code)


@contextmanager
def handle_errors(cli_options: bool = False) -> Iterator[None]:
    """gpupool's errors as one line each on stderr and their exit code, as
    :func:`gpupool.cli.session.handle_errors` prints them."""
    try:
        yield
    except SpecError as exc:
        for line in spec_problems(exc, cli_options):
            echo(f"error: {line}", err=True)
        raise SystemExit(EXIT_INVALID) from None
    except ClientError as exc:
        raise fail(str(exc), int(exc.exit_code)) from None
    except GpupoolError as exc:
        raise fail(str(exc), EXIT_INVALID) from None


def print_json(value: Any) -> None:
    """``value`` (plain data) as the commands print JSON: indented, keys sorted."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def terminal_width() -> int:
    """The terminal's width in columns, as rich finds it (``$COLUMNS`` first)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (1, 2, 0):
        try:
            return os.get_terminal_size(fd).columns or 80
        except OSError:
            continue
    return 80


def emit_table(table: FitTable) -> None:
    """Print a fitted table (see the module docstring)."""
    if not sys.stdout.isatty():
        width = max(400, table.natural_width())
        text = table.plain(width)
        if text is None:
            from gpupool.cli.session import render_text  # rich's layout

            text = render_text(table, width)
        sys.stdout.write(text)
        return
    text = table.plain(terminal_width())
    if text is None or os.environ.get("TERM") == "dumb":
        from gpupool.cli.session import console  # rich's layout

        console().print(table)
        return
    head, _, rest = text.partition("\n")
    sys.stdout.write(f"{BOLD}{head}{RESET}\n{rest}")
