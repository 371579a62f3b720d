"""Entry point of the ``gpupool`` command.

:func:`main` first offers the command line to the fast path (:mod:`gpupool.cli.hot`: ``version``
and the hot verbs, without typer); everything else goes to the typer app of
:mod:`gpupool.cli.app`, over the lazily loaded command modules. ``app``, ``root_command`` and
``walk`` are that module's, loaded on first use, so importing this module costs nothing.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_FROM_APP = ("app", "root_command", "walk", "version", "root")


def __getattr__(name: str) -> Any:
    if name in _FROM_APP:
        from gpupool.cli import app as app_module

        return getattr(app_module, name)
    raise AttributeError(f"module 'gpupool.cli.main' has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    try:
        from gpupool.cli.hot import dispatch

        code = dispatch(sys.argv[1:])
        if code is not None:
            sys.exit(code)
        from gpupool.cli.app import app

        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
