"""``gpupool up``: the whole pool on this machine, in one process.

The API server, the SQLite store, the scheduling loop and a local agent (real GPUs, else
simulated ones). The port comes from ``--port``, else ``$GPUPOOL_PORT``, else 8470.

**Stopping** (Ctrl-C or SIGTERM): the API, the scheduling loop and the local agent stop; the
jobs running on this machine do not: each runs under its own supervisor, in its own session,
and keeps running; ``gpupool up`` re-adopts them when it starts again (within the node timeout
they are never judged lost). It says so as it stops, with how many are running. uvicorn
re-raises the SIGTERM it caught once it has shut down, which killed the process before that
could be said; a handler of ours turns it into an exception that unwinds to it instead.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import typer

from gpupool import __version__
from gpupool.cli.agent import RUN_AS_ENV, RUN_AS_HELP

#: The least time ``gpupool up`` keeps a token's principal in memory (seconds; ``gpupool
#: server``'s default is 5 s, for the revocations of other server processes). A standalone
#: pool's store is its own, in its private home, so every revocation and user deletion goes
#: through this process, which drops the cache at once; the limit is there only for other
#: processes, of which there are none. Kept longer than the node timeout, so the local agent's
#: quiet heartbeats (every third of it) and long polls (25 s) find their token in memory and
#: are answered without a worker thread or a store read (issue 26: the idle pool sleeps).
UP_AUTH_CACHE_S = 300.0
#: ... and at most a day (the setting's bound).
UP_AUTH_CACHE_MAX_S = 86400.0


class _Terminated(Exception):
    """SIGTERM reached ``gpupool up`` (``kill``, systemd, a container runtime stopping it)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def stopped_message(running: int, why: str) -> str:
    """What ``gpupool up`` says as it stops with ``running`` jobs on this machine."""
    if running == 0:
        return f"gpupool stopped ({why}); no job was running on this machine"
    jobs = "1 job keeps" if running == 1 else f"{running} jobs keep"
    return (
        f"gpupool stopped ({why}): the API, the scheduler and the local agent are down, but "
        f"{jobs} running on this machine; `gpupool up` re-adopts them when it starts again "
        "(to stop them, start it and `gpupool cancel` them, or cancel them before stopping)"
    )


def up(  # noqa: PLR0917 - one typer option per parameter
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8470, envvar="GPUPOOL_PORT", help="port of the API server"),
    home: Path | None = typer.Option(None, help="gpupool home (default $GPUPOOL_HOME)"),  # noqa: B008
    simulate: str | None = typer.Option(
        None, help="simulate GPUs (e.g. 4xA100-80GB,2xT4); default: real GPUs, else 4xA100-80GB"
    ),
    run_as: str = typer.Option("auto", envvar=RUN_AS_ENV, help=RUN_AS_HELP),
    heartbeat: float = typer.Option(5.0, help="agent heartbeat interval, seconds"),
    node_timeout: float = typer.Option(
        30.0,
        help="silence before a node is marked down, seconds (a pool stopped for longer keeps "
        "its jobs: the restarted server waits this long before judging silence)",
    ),
) -> None:
    """Run the pool on this machine: API server, SQLite store, scheduling loop and local agent.

    A store made by an older gpupool is migrated to this version's schema at start. Started by
    an ordinary user, jobs run as that user (the pool is theirs); started as root, each job
    runs as its submitter's account or a transient one of its own, never as root (see
    docs/security.md).

    Example: ``gpupool up --port 8470 --simulate 2xA100-80GB,2xT4``
    (``--heartbeat`` and ``--node-timeout`` as ``gpupool server`` has them)
    """
    from gpupool.agent.runas import check_mode, switches_account
    from gpupool.cli.agent import jobs_run_as, start_local_agent
    from gpupool.cli.server import serve
    from gpupool.cli.session import handle_errors
    from gpupool.control.settings import ServerSettings
    from gpupool.domain.errors import GpupoolError

    # A standalone pool is one person's: its store follows gpupool's upgrades by itself
    # (a cluster's `gpupool server` waits for --migrate).
    with handle_errors():  # an impossible number: one line, exit 2
        settings = ServerSettings.build(
            home,
            host=host,
            port=port,
            migrate=True,
            heartbeat_interval_s=heartbeat,
            node_timeout_s=node_timeout,
            auth_cache_s=min(UP_AUTH_CACHE_MAX_S, max(UP_AUTH_CACHE_S, 2 * node_timeout)),
        )
    try:
        # The home itself is made passable at start; the folders above it must already be.
        check_mode(run_as, [settings.home.parent])
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"gpupool {__version__}: dashboard http://{host}:{port}/, API docs at /docs")
    typer.echo(jobs_run_as(run_as, f"the admin token and the store in {settings.home}"))
    local = start_local_agent(settings, simulate, run_as)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    why = "stopped"
    try:
        serve(settings, others_may_pass=switches_account(run_as))
    except _Terminated:
        why = "SIGTERM"
    except KeyboardInterrupt:
        why = "Ctrl-C"
    finally:
        signal.signal(signal.SIGTERM, previous)
        running = local.agent.executor.live_supervisors() if local.agent is not None else 0
        local.stop()
        typer.echo(stopped_message(running, why))


def install(app: typer.Typer) -> None:
    app.command(name="up")(up)
