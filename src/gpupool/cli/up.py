"""``gpupool up``: the whole pool on this machine, in one process.

The API server, the SQLite store, the scheduling loop and a local agent (real GPUs, else
simulated ones). The port comes from ``--port``, else ``$GPUPOOL_PORT``, else 8470.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool import __version__


def up(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8470, envvar="GPUPOOL_PORT", help="port of the API server"),
    home: Path | None = typer.Option(None, help="gpupool home (default $GPUPOOL_HOME)"),  # noqa: B008
    simulate: str | None = typer.Option(
        None, help="simulate GPUs (e.g. 4xA100-80GB,2xT4); default: real GPUs, else 4xA100-80GB"
    ),
) -> None:
    """Run the pool on this machine: API server, SQLite store, scheduling loop and local agent.

    A store made by an older gpupool is migrated to this version's schema at start.

    Example: ``gpupool up --port 8470 --simulate 2xA100-80GB,2xT4``
    """
    from gpupool.cli.agent import start_local_agent
    from gpupool.cli.server import serve
    from gpupool.control.settings import ServerSettings

    # A standalone pool is one person's: its store follows gpupool's upgrades by itself
    # (a cluster's `gpupool server` waits for --migrate).
    settings = ServerSettings.build(home, host=host, port=port, migrate=True)
    typer.echo(f"gpupool {__version__}: dashboard http://{host}:{port}/, API docs at /docs")
    local = start_local_agent(settings, simulate)
    try:
        serve(settings)
    finally:
        local.stop()
        typer.echo("gpupool stopped; running jobs are re-adopted when it starts again")


def install(app: typer.Typer) -> None:
    app.command(name="up")(up)
