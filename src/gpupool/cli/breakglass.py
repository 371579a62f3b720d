"""``gpupool admin-token``: issue an admin token straight into the store (break glass).

The first start of a server writes an admin token to ``$GPUPOOL_HOME/admin-token``. On a cluster
that file lives on whichever server replica bootstrapped the store, and it may be gone (a pod's
disk, a lost laptop). This command, run where the store is reachable (``--database-url`` or
``$GPUPOOL_DATABASE_URL``), prints a new token of an admin user once and records it in the audit
log. It needs the database's credentials, not an API token: whoever can write the database owns
the pool anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpupool.domain.errors import GpupoolError
from gpupool.domain.units import parse_duration

#: The user the first start creates (``gpupool.control.bootstrap.ADMIN_USER``; not imported
#: here so that ``gpupool --help`` does not load the store).
FIRST_ADMIN = "admin"


def admin_token(  # noqa: PLR0917 - one typer option per parameter
    home: Annotated[Path | None, typer.Option(help="gpupool home (default $GPUPOOL_HOME)")] = None,
    database_url: Annotated[
        str | None,
        typer.Option(help="SQLAlchemy URL (default $GPUPOOL_DATABASE_URL, else SQLite under home)"),
    ] = None,
    user: Annotated[str, typer.Option(help="admin user to issue it for")] = FIRST_ADMIN,
    name: Annotated[str, typer.Option(help="token name, shown in gpupool tokens")] = "break glass",
    ttl: Annotated[str | None, typer.Option(help="lifetime, e.g. 1d (default: no expiry)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the secret")] = False,
) -> None:
    """Issue an admin token directly in the store, for a pool whose admin token is lost.

    Examples:

      gpupool admin-token --database-url postgresql+psycopg://gpupool@db/gpupool --ttl 1d

      kubectl exec deploy/gpupool-server -- gpupool admin-token -q > admin-token
    """
    from sqlalchemy.exc import SQLAlchemyError

    from gpupool.control.bootstrap import bootstrap
    from gpupool.control.context import ControlPlane
    from gpupool.control.services import audit
    from gpupool.control.services.users import insert_token
    from gpupool.control.settings import ServerSettings
    from gpupool.domain.users import Role
    from gpupool.store.models import UserModel

    try:
        ttl_s = parse_duration(ttl, field="--ttl") if ttl is not None else None
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    settings = ServerSettings.build(home, database_url, schedule=False)
    cp = ControlPlane(settings)
    try:
        cp.prepare()  # refuses a store of an unknown schema, with how to migrate
        bootstrap(cp)  # an empty store gets its defaults (and its first-start admin) first
        with cp.tx() as s:
            row = s.get(UserModel, user)
            if row is None or row.role != Role.ADMIN.value:
                what = "does not exist" if row is None else f"has role {row.role}"
                raise GpupoolError(
                    f"user {user!r} {what}: name an admin user with --user "
                    "(gpupool users lists them)"
                )
            issued = insert_token(s, user, name, cp.now(), ttl_s)
            audit.record(
                s, None, "token.create", cp.now(), target=user, user="admin-token", role="system"
            )
    except GpupoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except SQLAlchemyError as exc:
        typer.echo(
            f"error: cannot use the store at {settings.database_url}: {exc.__class__.__name__}: "
            f"{str(exc).splitlines()[0]}; check --database-url and that the database answers",
            err=True,
        )
        raise typer.Exit(5) from None
    finally:
        cp.close()
    if quiet:
        typer.echo(issued.secret)
        return
    typer.echo(f"admin token for {user} (id {issued.id}; shown once, keep it safe):")
    typer.echo(issued.secret)


def install(app: typer.Typer) -> None:
    app.command(name="admin-token")(admin_token)
