"""``gpupool login`` and ``logout``: keep the server URL and token in the user's config file.

The file is ``$XDG_CONFIG_HOME/gpupool/config.toml`` (``~/.config/...``), created with mode
0600 (see :mod:`gpupool.client.config`). ``login`` checks the token against the server before
saving it, unless ``--no-verify``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli.session import fail, handle_errors, session
from gpupool.client.config import DEFAULT_SERVER, config_path, read_config, write_config


def login(
    server: Annotated[
        str | None, typer.Option("--server", help=f"server URL (default {DEFAULT_SERVER})")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="API token (prompted for, hidden, when absent)")
    ] = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="check it first")] = True,
) -> None:
    """Save the server URL and your token for every later command (file mode 0600).

    Examples:

      gpupool login --server http://pool.lab:8470          # asks for the token

      gpupool login --server http://pool.lab:8470 --token "$(cat token.txt)"
    """
    url = (server or DEFAULT_SERVER).rstrip("/")
    secret = token or typer.prompt("API token", hide_input=True).strip()
    if not secret:
        raise fail("the token is empty: paste the token an admin gave you (gpupool tokens create)")
    path = config_path()
    if verify:
        with session(url, secret) as gp:
            who = gp.whoami()
        tenant = f", tenant {who.tenant}" if who.tenant else ""
        typer.echo(f"logged in to {url} as {who.user} (role {who.role}{tenant})")
    with handle_errors():
        write_config(path, url, secret)
    typer.echo(f"saved in {path} (mode 0600)")


def logout() -> None:
    """Forget the saved server and token.  Example: gpupool logout"""
    path = config_path()
    with handle_errors():
        found = read_config(path)
    if not found:
        typer.echo(f"not logged in ({path} has no token)")
        return
    path.unlink()
    typer.echo(f"removed {path}")


def install(app: typer.Typer) -> None:
    app.command(name="login")(login)
    app.command(name="logout")(logout)
