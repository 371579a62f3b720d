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
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpupool import __version__
from gpupool.cli.session import handle_errors
from gpupool.control.settings import ServerSettings
from gpupool.domain.errors import GpupoolError

if TYPE_CHECKING:
    from fastapi import FastAPI


def pool_app(settings: ServerSettings) -> FastAPI:
    """The whole pool's app: the API (:mod:`gpupool.api`) with the dashboard
    (:mod:`gpupool.web`) mounted beside it. This is where the two edges meet: neither imports
    the other."""
    from gpupool.api.app import create_app
    from gpupool.web.routes import router as dashboard

    return create_app(settings, routers=(dashboard,))


def app_from_environment() -> FastAPI:
    """The app of one worker process of ``gpupool server --workers N`` (uvicorn's factory)."""
    from gpupool.api.app import settings_from_environment

    return pool_app(settings_from_environment())


def write_server_url(settings: ServerSettings) -> Path:
    """Write ``<home>/server-url`` so clients on this machine find the server (see
    :mod:`gpupool.client.config`); a wildcard listen address is reached via 127.0.0.1."""
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    path = settings.home / "server-url"
    settings.home.mkdir(parents=True, exist_ok=True)
    # No secret in it, but only this account's clients read it: private like the rest.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"http://{host}:{settings.port}\n")
    return path


def serve(
    settings: ServerSettings,
    *,
    log_level: str = "warning",
    workers: int = 1,
    others_may_pass: bool = False,
) -> None:
    """Run the server until interrupted; errors a person can act on exit with code 2.

    The home is made private first (``store.db.secure_home``: ``0700``, its token files and
    SQLite files ``0600``); ``others_may_pass`` makes it ``0711`` instead, for ``gpupool up
    --run-as``, whose jobs run as another account and reach their folders under
    ``home/agent``. With ``workers > 1`` the store is prepared here, then uvicorn starts that
    many worker processes; each runs the scheduling loop, and the leader lease lets one of
    them schedule.
    """
    import uvicorn

    from gpupool.api.app import SETTINGS_ENV
    from gpupool.cli.serverhttp import CoalescingHttpTools
    from gpupool.control.bootstrap import bootstrap
    from gpupool.control.context import ControlPlane

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from gpupool.store.db import secure_home

    try:
        secure_home(settings.home, others_may_pass=others_may_pass)
        if workers > 1:
            cp = ControlPlane(settings)
            cp.prepare()
            wrote = bootstrap(cp) is not None
            cp.close()
            app = None
        else:
            app = pool_app(settings)
            wrote = app.state.admin_token_path is not None
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    token = settings.admin_token_path
    if wrote:
        typer.echo(f"admin token written to {token} (mode 0600): keep it safe")
    else:
        typer.echo(f"admin token: {token} (written at first start)")
    store = "SQLite" if settings.database_url.startswith("sqlite") else "PostgreSQL"
    url = f"http://{settings.host}:{settings.port}"
    typer.echo(f"gpupool server starting on {url} ({store}; API docs at {url}/docs)")
    typer.echo(f"dashboard: {url}/")
    write_server_url(settings)
    # Keep idle connections longer than clients usually do, so a client never reuses a
    # connection the server is closing (uvicorn's default is 5 s).
    common = {
        "host": settings.host,
        "port": settings.port,
        "log_level": log_level,
        "timeout_keep_alive": 75,
        # On SIGTERM/Ctrl-C, give in-flight requests a moment, then stop: an agent's long poll
        # (up to 25 s) must not hold a stopping server.
        "timeout_graceful_shutdown": 3,
        # X-Forwarded-For is read by the app, from the proxies the admin named only
        # (gpupool.api.clientaddr): uvicorn's own reading trusts 127.0.0.1 by default.
        "proxy_headers": False,
        # uvicorn's httptools protocol, a response's writes sent as one (cli/serverhttp.py)
        "http": CoalescingHttpTools,
    }
    if app is not None:
        from gpupool.cli.serverloop import PoolServer

        # On SIGTERM or Ctrl-C, agents' long polls answer now instead of at their timeout.
        config = uvicorn.Config(app, access_log=False, **common)  # type: ignore[arg-type]
        PoolServer(config, on_exit=app.state.services.cp.orders.release_all).run()
        return
    os.environ[SETTINGS_ENV] = settings.to_json()
    uvicorn.run(
        "gpupool.cli.server:app_from_environment",
        factory=True,
        workers=workers,
        access_log=False,
        **common,  # type: ignore[arg-type]
    )


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
    preempt_exempt: float = typer.Option(
        300.0, help="seconds a running job is safe from preemption (anti-loop)"
    ),
    leader_lease: float = typer.Option(
        15.0,
        help="seconds the scheduling lease lasts unrenewed: a frozen leader is replaced by a "
        "standby server within this time",
    ),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
    workers: int = typer.Option(1, help="API worker processes (one of them schedules)"),
    metrics_token: bool = typer.Option(
        False, "--metrics-token", help="/metrics needs an admin or operator token"
    ),
    metrics_tenants: bool = typer.Option(
        False, "--metrics-tenants", help="/metrics names tenants (default: per pool only)"
    ),
    trusted_proxies: str = typer.Option(
        "",
        "--trusted-proxies",
        help="CIDR,...: reverse proxies whose X-Forwarded-For names the caller in the audit "
        "log (default: none; the header is ignored)",
    ),
    smtp_host: str | None = typer.Option(
        None,
        envvar="GPUPOOL_SMTP_HOST",
        help="SMTP host that --mail-user ADDRESS notices are sent through (default: none)",
    ),
    smtp_port: int = typer.Option(25, envvar="GPUPOOL_SMTP_PORT", help="SMTP port"),
    smtp_from: str = typer.Option(
        "gpupool@localhost", envvar="GPUPOOL_SMTP_FROM", help="sender of notice e-mails"
    ),
    smtp_starttls: bool = typer.Option(
        False, "--smtp-starttls", envvar="GPUPOOL_SMTP_STARTTLS", help="use STARTTLS"
    ),
    mail_webhook: str | None = typer.Option(
        None,
        envvar="GPUPOOL_MAIL_WEBHOOK",
        help="URL that notices of jobs without --mail-user are POSTed to (JSON)",
    ),
) -> None:
    """Run the control plane: REST API, store and scheduling loop.

    Example: ``gpupool server --home /tmp/gp --port 18470``
    """
    with handle_errors():  # an impossible number: one line, exit 2
        settings = ServerSettings.build(
            home,
            database_url,
            host=host,
            port=port,
            migrate=migrate,
            schedule=schedule,
            heartbeat_interval_s=heartbeat,
            node_timeout_s=node_timeout,
            preempt_exempt_s=preempt_exempt,
            leader_lease_s=leader_lease,
            metrics_token=metrics_token,
            metrics_tenants=metrics_tenants,
            trusted_proxies=tuple(p.strip() for p in trusted_proxies.split(",") if p.strip()),
            smtp_host=smtp_host or None,
            smtp_port=smtp_port,
            smtp_from=smtp_from,
            smtp_starttls=smtp_starttls,
            mail_webhook=mail_webhook or None,
        )
    typer.echo(f"gpupool {__version__} server, home {settings.home}")
    serve(settings, log_level=log_level, workers=workers)


def install(app: typer.Typer) -> None:
    app.command(name="server")(server)
