"""``gpupool server``: the control plane (API, store, scheduling loop) in one process.

Example, a throwaway server for a test on a free port::

    GPUPOOL_HOME=$(mktemp -d) gpupool server --port 18470
    # first start prints: admin token written to $GPUPOOL_HOME/admin-token (mode 0600)
    curl -H "Authorization: Bearer $(cat $GPUPOOL_HOME/admin-token)" localhost:18470/v1/whoami

The store is SQLite under ``--home`` unless ``--database-url`` / ``$GPUPOOL_DATABASE_URL``
names PostgreSQL. A store with an older schema is refused until ``--migrate`` is given once.
Wait for ``GET /readyz`` to answer 200 before sending work.
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from gpupool import __version__
from gpupool.control.settings import ServerSettings
from gpupool.domain.errors import GpupoolError


def serve(settings: ServerSettings, *, log_level: str = "warning") -> None:
    """Run the server until interrupted; errors a person can act on exit with code 2."""
    import uvicorn

    from gpupool.api.app import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        app = create_app(settings)
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    token = settings.admin_token_path
    if app.state.admin_token_path is not None:
        typer.echo(f"admin token written to {token} (mode 0600): keep it safe")
    else:
        typer.echo(f"admin token: {token} (written at first start)")
    store = "SQLite" if settings.database_url.startswith("sqlite") else "PostgreSQL"
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=log_level, access_log=False
    )
    url = f"http://{settings.host}:{settings.port}"
    typer.echo(f"gpupool server starting on {url} ({store}; API docs at {url}/docs)")
    uvicorn.Server(config).run()


def server(  # noqa: PLR0917 - one typer option per parameter
    home: Path | None = typer.Option(None, help="gpupool home (default $GPUPOOL_HOME)"),  # noqa: B008
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8470, help="port of the API server"),
    database_url: str | None = typer.Option(
        None, help="SQLAlchemy URL (default $GPUPOOL_DATABASE_URL, else SQLite under home)"
    ),
    migrate: bool = typer.Option(False, "--migrate", help="upgrade an older store's schema"),
    schedule: bool = typer.Option(True, help="run the scheduling loop (leader only)"),
    heartbeat: float = typer.Option(5.0, help="agent heartbeat interval, seconds"),
    node_timeout: float = typer.Option(30.0, help="silence before a node is marked down, seconds"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
) -> None:
    """Run the control plane: REST API, store and scheduling loop.

    Example: ``gpupool server --home /tmp/gp --port 18470``
    """
    settings = ServerSettings.build(
        home,
        database_url,
        host=host,
        port=port,
        migrate=migrate,
        schedule=schedule,
        heartbeat_interval_s=heartbeat,
        node_timeout_s=node_timeout,
    )
    typer.echo(f"gpupool {__version__} server, home {settings.home}")
    serve(settings, log_level=log_level)
