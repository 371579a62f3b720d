"""Entry point of the ``gpupool`` command.

Commands live in one module per group; this module wires them into one typer app.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpupool import __version__
from gpupool.cli.agent import run_agent
from gpupool.cli.breakglass import admin_token
from gpupool.cli.commands import install as install_client_commands
from gpupool.cli.server import server
from gpupool.cli.simulate import simulate_app
from gpupool.domain.errors import SpecError
from gpupool.domain.jobspec import parse_job_yaml
from gpupool.domain.units import format_duration, format_gpus, format_memory

app = typer.Typer(
    name="gpupool",
    help="gpupool: one shared pool over every GPU your team owns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(simulate_app, name="simulate")
app.command(name="agent")(run_agent)
app.command(name="server")(server)
app.command(name="admin-token")(admin_token)
install_client_commands(app)


@app.command()
def version() -> None:
    """Print gpupool's version."""
    typer.echo(__version__)


@app.command()
def validate(
    job_file: Path = typer.Argument(..., help="YAML job file to check", exists=False),  # noqa: B008
) -> None:
    """Check a job file without submitting it (like ``sbatch --test-only``).

    Example: ``gpupool validate examples/train.yaml``
    """
    try:
        text = job_file.read_text(encoding="utf-8")
    except OSError as exc:
        typer.echo(f"error: cannot read {job_file}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    try:
        spec = parse_job_yaml(text, source=str(job_file))
    except SpecError as exc:
        for problem in exc.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1) from None
    res = spec.resources
    mem = format_memory(res.gpu_memory_mib) if res.gpu_memory_mib is not None else "share"
    limit = format_duration(spec.time_limit_s) if spec.time_limit_s is not None else "pool"
    typer.echo(
        f"ok: {spec.name}: {spec.replicas} x {format_gpus(res.gpu_milli)} GPU, "
        f"gpu memory {mem}, pool {spec.pool}, priority {spec.priority_class}, "
        f"time limit {limit}"
    )


@app.command()
def up(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8470, help="port of the API server"),
    home: Path | None = typer.Option(None, help="gpupool home (default $GPUPOOL_HOME)"),  # noqa: B008
    simulate: str | None = typer.Option(
        None, help="simulate GPUs (e.g. 4xA100-80GB,2xT4); default: real GPUs, else 4xA100-80GB"
    ),
    run_as: str = typer.Option(
        "agent",
        help="whose Unix account jobs run as: 'agent' (yours: one-person pools only, a job can "
        "read the admin token), 'submitter' or an account's name (needs root)",
    ),
) -> None:
    """Run the pool on this machine: API server, SQLite store, scheduling loop and local agent.

    A store made by an older gpupool is migrated to this version's schema at start. Jobs run
    as your account unless ``--run-as`` names another (see docs/deploy.md).

    Example: ``gpupool up --port 8470 --simulate 2xA100-80GB,2xT4``
    """
    from gpupool.agent.runas import check_mode, switches_account
    from gpupool.cli.agent import jobs_run_as, start_local_agent
    from gpupool.cli.server import serve
    from gpupool.control.settings import ServerSettings
    from gpupool.domain.errors import GpupoolError

    # A standalone pool is one person's: its store follows gpupool's upgrades by itself
    # (a cluster's `gpupool server` waits for --migrate).
    settings = ServerSettings.build(home, host=host, port=port, migrate=True)
    try:
        # The home itself is made passable at start; the folders above it must already be.
        check_mode(run_as, [settings.home.parent])
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"gpupool {__version__}: dashboard http://{host}:{port}/, API docs at /docs")
    typer.echo(jobs_run_as(run_as, f"the admin token and the store in {settings.home}"))
    local = start_local_agent(settings, simulate, run_as)
    try:
        serve(settings, others_may_pass=switches_account(run_as))
    finally:
        local.stop()
        typer.echo("gpupool stopped; running jobs are re-adopted when it starts again")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
