"""The table of ``gpupool``'s commands, loaded lazily.

Commands live in one module per group, each with an ``install(app)`` that adds its commands:
:mod:`~gpupool.cli.jobs` (submit, run, queue), :mod:`~gpupool.cli.alloc` (alloc),
:mod:`~gpupool.cli.jobinfo` (show, logs, fetch, history),
:mod:`~gpupool.cli.jobctl` (cancel, hold, release, requeue, update), :mod:`~gpupool.cli.sprio`
(priority), :mod:`~gpupool.cli.resize`,
:mod:`~gpupool.cli.infra` (nodes, gpus, drain, resume), :mod:`~gpupool.cli.admin` (pools,
tenants, quota, priority-classes, users, tokens, audit), :mod:`~gpupool.cli.top`,
:mod:`~gpupool.cli.report`, :mod:`~gpupool.cli.precheck`, :mod:`~gpupool.cli.login`,
:mod:`~gpupool.cli.validate`, and the processes: ``up``, ``server``, ``agent``,
``admin-token`` and ``simulate``.

:data:`COMMANDS` names the module of every top-level command, and :class:`LazyGroup` (the root
group of the app) imports a module only when one of its commands runs, or when ``gpupool
--help`` lists them all. So ``gpupool queue`` imports the SDK and the tables, not the server,
the store, the simulator or the agent, and starts in a fraction of the CPU time an eager import
of everything took (``benchmarks/bench_cli_startup.py``, ``docs/benchmarks.md``). A command
missing from the table still works (every module is loaded to find it, at the old cost);
``tests/cli/test_startup.py`` keeps the table complete. A new command: add it to its module's
``install`` and its name here.
"""

from __future__ import annotations

import importlib

import typer
from typer.core import TyperGroup

try:  # typer 0.22 and later carry their own click: their groups take its types
    from typer import _click as click
except ImportError:  # pragma: no cover - older typer, over the click package
    import click  # type: ignore[no-redef]

#: Every top-level command, in the order ``gpupool --help`` lists them, and its module.
COMMANDS: dict[str, str] = {
    "submit": "gpupool.cli.jobs",
    "run": "gpupool.cli.jobs",
    "queue": "gpupool.cli.jobs",
    "alloc": "gpupool.cli.alloc",
    "show": "gpupool.cli.jobinfo",
    "logs": "gpupool.cli.jobinfo",
    "fetch": "gpupool.cli.jobinfo",
    "history": "gpupool.cli.jobinfo",
    "cancel": "gpupool.cli.jobctl",
    "hold": "gpupool.cli.jobctl",
    "release": "gpupool.cli.jobctl",
    "requeue": "gpupool.cli.jobctl",
    "update": "gpupool.cli.jobctl",
    "priority": "gpupool.cli.sprio",
    "resize": "gpupool.cli.resize",
    "nodes": "gpupool.cli.infra",
    "gpus": "gpupool.cli.infra",
    "drain": "gpupool.cli.infra",
    "resume": "gpupool.cli.infra",
    "top": "gpupool.cli.top",
    "report": "gpupool.cli.report",
    "pools": "gpupool.cli.admin",
    "tenants": "gpupool.cli.admin",
    "quota": "gpupool.cli.admin",
    "priority-classes": "gpupool.cli.admin",
    "users": "gpupool.cli.admin",
    "tokens": "gpupool.cli.admin",
    "audit": "gpupool.cli.admin",
    "precheck": "gpupool.cli.precheck",
    "login": "gpupool.cli.login",
    "logout": "gpupool.cli.login",
    "validate": "gpupool.cli.validate",
    "up": "gpupool.cli.up",
    "server": "gpupool.cli.server",
    "agent": "gpupool.cli.agent",
    "admin-token": "gpupool.cli.breakglass",
    "simulate": "gpupool.cli.simulate",
}


class LazyGroup(TyperGroup):
    """The root group: a command's module is imported the first time the command is needed."""

    def __init__(self, **attrs: object) -> None:
        super().__init__(**attrs)  # type: ignore[arg-type]
        self._loaded: set[str] = set()

    def _load(self, module: str) -> None:
        if module in self._loaded:
            return
        self._loaded.add(module)
        group = typer.Typer()
        importlib.import_module(module).install(group)
        for name, command in typer.main.get_group(group).commands.items():
            self.commands.setdefault(name, command)

    def load_all(self) -> None:
        """Import every command module (``--help``, an unknown name, the command tests)."""
        for module in dict.fromkeys(COMMANDS.values()):
            self._load(module)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            module = COMMANDS.get(cmd_name)
            if module is not None:
                self._load(module)
            if cmd_name not in self.commands:
                self.load_all()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_all()
        known = [n for n in COMMANDS if n in self.commands]
        return known + [n for n in self.commands if n not in COMMANDS]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in COMMANDS and args[0] not in self.commands:
            self.load_all()  # an unknown name: typer suggests the close ones from all commands
        return super().resolve_command(ctx, args)


__all__ = ["COMMANDS", "LazyGroup", "click"]
