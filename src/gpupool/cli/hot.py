"""The fast path of ``gpupool``: the hot verbs without typer (see :mod:`gpupool.cli.options`).

:func:`dispatch` is the first thing ``gpupool`` runs. For ``version`` and the hot verbs in
:data:`HOT` it reads the command line with the verb's option table; when the fast parser is
sure it reads it as click would, the verb's implementation (:mod:`gpupool.cli.hotjobs`) runs
at once and typer is never imported. Anything else (another verb, ``--help``, an option it does
not know, a value click would refuse) answers ``None``, and :mod:`gpupool.cli.main` hands the
command line to the typer app, which runs the same implementation after its own parsing, or
prints its usual help or error. ``benchmarks/bench_cli_startup.py`` measures both paths;
``tests/cli/test_startup.py`` checks what the hot verbs import.
"""

from __future__ import annotations

import sys

from gpupool import __version__
from gpupool.cli import options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Each hot verb: its option table, and whether options may follow its arguments (``submit``
#: and ``run``: no, the first argument starts the job's command).
HOT: dict[str, tuple[tuple[options.Param, ...], bool]] = {
    "submit": (options.SUBMIT, False),
    "queue": (options.QUEUE, True),
    "cancel": (options.CANCEL, True),
    "show": (options.SHOW, True),
}


def dispatch(argv: Sequence[str]) -> int | None:
    """Run the command line ``argv`` here if it is a hot verb the fast parser reads; its exit
    status, or ``None`` for the typer app to run it."""
    if not argv:
        return None
    verb = argv[0]
    if verb == "version" and len(argv) == 1:
        sys.stdout.write(__version__ + "\n")
        return 0
    entry = HOT.get(verb)
    if entry is None:
        return None
    table, interspersed = entry
    params = options.parse(table, argv[1:], interspersed=interspersed)
    if params is None:
        return None
    from gpupool.cli import hotjobs

    try:
        getattr(hotjobs, verb)(params)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.stdout.flush()
    return 0
