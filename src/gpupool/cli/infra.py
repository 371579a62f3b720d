"""Infrastructure commands: ``nodes`` (and ``nodes delete``), ``gpus`` (inventory with live
telemetry), ``drain`` and ``resume`` (like ``scontrol update nodename=X state=drain``).

A **draining** node keeps its running jobs but takes no new ones; ``resume`` puts it back up.
A node that is **down** (its agent silent past the node timeout) and holds no job may be
deleted (``gpupool nodes delete NAME``, like ``scontrol delete nodename=X``); its agent, if it
returns, registers it anew.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from gpupool.cli import render
from gpupool.cli.session import JsonOpt, ServerOpt, TokenOpt, emit, print_json, session
from gpupool.control.machinery.clock import SystemClock

nodes_app = typer.Typer(name="nodes", no_args_is_help=False, invoke_without_command=True)


@nodes_app.callback()
def nodes(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List the pool's nodes: state, GPUs, isolation modes, last heartbeat; or delete a down one.

    Examples:

      gpupool nodes

      gpupool nodes --json

      gpupool nodes delete gpu-07
    """
    if ctx.invoked_subcommand is not None:
        return
    with session(server, token) as gp:
        found = gp.nodes()
        if json_out:
            print_json(found)
            return
        emit(render.nodes_table(found, SystemClock().now()))


@nodes_app.command("delete")
def nodes_delete(
    name: Annotated[str, typer.Argument(help="node name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a node that is down and holds no job, with its GPUs (operator or admin; audited).

    Example: gpupool nodes delete gpu-07
    """
    with session(server, token) as gp:
        gp.delete_node(name)
        typer.echo(f"node {name} deleted")


def gpus(
    node: Annotated[str | None, typer.Option("--node", help="only this node's GPUs")] = None,
    pool: Annotated[str | None, typer.Option("-p", "--pool", help="only this pool")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List every GPU with what is allocated on it and its latest telemetry (like nvidia-smi).

    Examples:

      gpupool gpus

      gpupool gpus --node gpu-07 --json
    """
    with session(server, token) as gp:
        devices = [
            d
            for d in gp.devices()
            if (node is None or d.node == node) and (pool is None or d.pool == pool)
        ]
        samples = {s.uuid: s for s in gp.telemetry().devices}
        if json_out:
            print_json(
                [
                    {
                        "device": d,
                        "telemetry": dataclasses.asdict(samples[d.uuid])
                        if d.uuid in samples
                        else None,
                    }
                    for d in devices
                ]
            )
            return
        emit(render.gpus_table(devices, samples))


def _set_state(
    name: str, state: str, server: str | None, token: str | None, json_out: bool
) -> None:
    with session(server, token) as gp:
        view = gp.set_node_state(name, state)
        if json_out:
            print_json(view)
        else:
            typer.echo(f"node {view.name}: {view.state}")


def drain(
    node: Annotated[str, typer.Argument(help="node name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Stop placing new jobs on a node; its running jobs go on (operator or admin).

    Example: gpupool drain gpu-07
    """
    _set_state(node, "draining", server, token, json_out)


def resume(
    node: Annotated[str, typer.Argument(help="node name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Put a drained node back in service.

    Example: gpupool resume gpu-07
    """
    _set_state(node, "up", server, token, json_out)


def install(app: typer.Typer) -> None:
    app.add_typer(nodes_app)
    for command in (gpus, drain, resume):
        app.command(name=command.__name__)(command)
