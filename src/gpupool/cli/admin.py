"""Admin commands: ``pools``, ``tenants``, ``quota``, ``priority-classes``, ``users``, ``tokens``,
``audit``.

Each is a group with ``list`` (the default when no sub-command is given) and the changes the
API allows. Amounts are typed as people write them (``--guaranteed 2``, ``--limit 0.5``,
``--mem-limit 80GiB``) and sent as milli-GPU and MiB. ``tokens create`` shows the secret once.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpupool.cli import render
from gpupool.cli.session import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    emit,
    fail,
    handle_errors,
    print_json,
    session,
)
from gpupool.control.machinery.clock import SystemClock
from gpupool.domain.tenants import FAIR_SHARE_RANGE
from gpupool.domain.units import format_gpus, parse_duration, parse_gpus, parse_memory


def _group(name: str) -> typer.Typer:
    """A command group whose help is its callback's docstring (with examples)."""
    return typer.Typer(name=name, no_args_is_help=False, invoke_without_command=True)


pools_app = _group("pools")
tenants_app = _group("tenants")
quota_app = _group("quota")
classes_app = _group("priority-classes")
users_app = _group("users")
tokens_app = _group("tokens")


def _show(value: Any, table: Any, json_out: bool) -> None:
    if json_out:
        print_json(value)
    else:
        emit(table)


# ------------------------------------------------------------------ pools


@pools_app.callback()
def pools_main(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List pools, or change one with a sub-command.

    Examples:

      gpupool pools

      gpupool pools set research --overcommit 1.5 --price A100=2.5 --default-price 1
    """
    if ctx.invoked_subcommand is None:
        with session(server, token) as gp:
            found = gp.pools()
            _show(found, render.pools_table(found), json_out)


def _prices(pairs: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs:
        model, sep, value = pair.partition("=")
        try:
            out[model] = float(value) if sep else float("nan")
        except ValueError:
            out[model] = float("nan")
        if not sep or out[model] != out[model] or out[model] < 0:
            raise typer.BadParameter(f"{pair!r} is not MODEL=PRICE: write it like A100=2.5")
    return out


@pools_app.command("set")
def pools_set(  # noqa: PLR0917 - typer options
    name: Annotated[str, typer.Argument(help="pool name")],
    placement: Annotated[str, typer.Option(help="placement policy")] = "default",
    overcommit: Annotated[float, typer.Option(help="GPU memory overcommit ratio, 1 to 4")] = 1.0,
    price: Annotated[
        list[str] | None, typer.Option(help="price per GPU-hour of a model: A100=2.5 (repeat)")
    ] = None,
    default_price: Annotated[float, typer.Option(help="price per GPU-hour otherwise")] = 0.0,
    oversubscription: Annotated[
        str,
        typer.Option(
            help="isolation shim: an allocation that fits the slice but not the GPU: fail or "
            "spill (to host memory)"
        ),
    ] = "fail",
    container_engine: Annotated[
        str | None, typer.Option(help="engine of --image jobs that name none: podman or docker")
    ] = None,
    image_registry: Annotated[
        list[str] | None,
        typer.Option(help="a registry images may come from, e.g. nvcr.io (repeat; none: any)"),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create or replace a pool.

    Example: gpupool pools set research --overcommit 1.5 --price A100=2.5
    """
    with session(server, token) as gp:
        saved = gp.put_pool(
            name,
            placement=placement,
            memory_overcommit=overcommit,
            price_per_gpu_hour=_prices(price or []),
            default_price_per_gpu_hour=default_price,
            memory_oversubscription=oversubscription,
            container_engine=container_engine,
            image_registries=image_registry or [],
        )
        _show(saved, render.pools_table([saved]), json_out)


@pools_app.command("delete")
def pools_delete(
    name: Annotated[str, typer.Argument(help="pool name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete an empty pool.  Example: gpupool pools delete scratch"""
    with session(server, token) as gp:
        gp.delete_pool(name)
        typer.echo(f"pool {name} deleted")


# ------------------------------------------------------------------ tenants


@tenants_app.callback()
def tenants_main(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List tenants with their quotas, or change one with a sub-command.

    Examples:

      gpupool tenants

      gpupool tenants set vision --fair-share 2 --display-name "Vision lab"
    """
    if ctx.invoked_subcommand is None:
        with session(server, token) as gp:
            found = [gp.tenant(t.name) for t in gp.tenants()]
            _show(found, render.tenants_table(found), json_out)


@tenants_app.command("set")
def tenants_set(  # noqa: PLR0917 - typer options
    name: Annotated[str, typer.Argument(help="tenant name")],
    fair_share: Annotated[
        float,
        typer.Option(
            help=f"relative share for fair-share ordering, {FAIR_SHARE_RANGE} (1 = equal)"
        ),
    ] = 1.0,
    display_name: Annotated[str, typer.Option(help="name shown in reports")] = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create or replace a tenant.  Example: gpupool tenants set vision --fair-share 2"""
    with session(server, token) as gp:
        saved = gp.put_tenant(name, fair_share=fair_share, display_name=display_name)
        _show(saved, render.tenants_table([saved]), json_out)


@tenants_app.command("delete")
def tenants_delete(
    name: Annotated[str, typer.Argument(help="tenant name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a tenant with no jobs or users.  Example: gpupool tenants delete old-team"""
    with session(server, token) as gp:
        gp.delete_tenant(name)
        typer.echo(f"tenant {name} deleted")


# ------------------------------------------------------------------ quota


@quota_app.callback()
def quota_main(ctx: typer.Context) -> None:
    """Set or remove a tenant's quota in a pool (gpupool tenants lists them).

    Examples:

      gpupool quota set vision default --guaranteed 2 --limit 4 --mem-limit 320GiB

      gpupool quota set vision default --guaranteed 0.5 --budget 100 --window 7d

      gpupool quota delete vision default
    """
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@quota_app.command("set")
def quota_set(  # noqa: PLR0917 - typer options
    tenant: Annotated[str, typer.Argument(help="tenant")],
    pool: Annotated[str, typer.Argument(help="pool")],
    guaranteed: Annotated[str, typer.Option(help="GPUs always available: 2, 0.5")] = "0",
    limit: Annotated[
        str | None, typer.Option(help="most GPUs with borrowing (none: no cap)")
    ] = None,
    mem_guaranteed: Annotated[str, typer.Option(help="GPU memory guaranteed, e.g. 80GiB")] = "0",
    mem_limit: Annotated[str | None, typer.Option(help="most GPU memory, e.g. 320GiB")] = None,
    budget: Annotated[float | None, typer.Option(help="GPU-hours allowed per window")] = None,
    window: Annotated[str, typer.Option(help="budget window, e.g. 30d")] = "30d",
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set a tenant's quota in a pool.  Example: gpupool quota set vision default --guaranteed 2"""
    with handle_errors():
        fields: dict[str, Any] = {
            "guaranteed_milli": parse_gpus(guaranteed),
            "limit_milli": parse_gpus(limit) if limit is not None else None,
            "guaranteed_memory_mib": parse_memory(mem_guaranteed, field="--mem-guaranteed"),
            "limit_memory_mib": parse_memory(mem_limit, field="--mem-limit") if mem_limit else None,
            "gpu_hour_budget": budget,
            "budget_window_s": parse_duration(window, field="--window"),
        }
    with session(server, token) as gp:
        saved = gp.set_quota(tenant, pool, **fields)
        if json_out:
            print_json(saved)
        else:
            typer.echo(
                f"quota of {saved.tenant} in {saved.pool}: guaranteed "
                f"{format_gpus(saved.guaranteed_milli)} GPU, limit "
                f"{'none' if saved.limit_milli is None else format_gpus(saved.limit_milli)}"
            )


@quota_app.command("delete")
def quota_delete(
    tenant: Annotated[str, typer.Argument(help="tenant")],
    pool: Annotated[str, typer.Argument(help="pool")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a tenant's quota in a pool.  Example: gpupool quota delete vision default"""
    with session(server, token) as gp:
        gp.delete_quota(tenant, pool)
        typer.echo(f"quota of {tenant} in {pool} removed")


# ------------------------------------------------------------------ priority classes


@classes_app.callback()
def classes_main(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List priority classes, or set one.

    Examples:

      gpupool priority-classes

      gpupool priority-classes set urgent 950
    """
    if ctx.invoked_subcommand is None:
        with session(server, token) as gp:
            found = gp.priority_classes()
            _show(found, render.priority_classes_table(found), json_out)


@classes_app.command("set")
def classes_set(
    name: Annotated[str, typer.Argument(help="class name")],
    value: Annotated[int, typer.Argument(help="its level, 0 to 1000000 (higher goes first)")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create or change a priority class.  Example: gpupool priority-classes set urgent 950"""
    with session(server, token) as gp:
        saved = gp.put_priority_class(name, value)
        _show(saved, render.priority_classes_table([saved]), json_out)


# ------------------------------------------------------------------ users


@users_app.callback()
def users_main(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
) -> None:
    """List users, or create and delete them.

    Examples:

      gpupool users

      gpupool users create alice --role member --tenant vision
    """
    if ctx.invoked_subcommand is None:
        with session(server, token) as gp:
            found = gp.users()
            _show(found, render.users_table(found), json_out)


@users_app.command("create")
def users_create(  # noqa: PLR0917 - typer options
    name: Annotated[str, typer.Argument(help="user name")],
    role: Annotated[
        str, typer.Option(help="admin, operator, tenant-admin, member, viewer or agent")
    ] = "member",
    tenant: Annotated[str | None, typer.Option(help="the user's tenant")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a user.  Example: gpupool users create alice --role member --tenant vision"""
    with session(server, token) as gp:
        saved = gp.create_user(name, role, tenant)
        _show(saved, render.users_table([saved]), json_out)


@users_app.command("delete")
def users_delete(
    name: Annotated[str, typer.Argument(help="user name")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a user (and revoke their tokens).  Example: gpupool users delete alice"""
    with session(server, token) as gp:
        gp.delete_user(name)
        typer.echo(f"user {name} deleted")


# ------------------------------------------------------------------ tokens


@tokens_app.callback()
def tokens_main(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="only this user's tokens")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List API tokens, or create and revoke them.

    Examples:

      gpupool tokens

      gpupool tokens create --user alice --name laptop --ttl 90d

      gpupool tokens revoke 3f2a9c1d0b7e
    """
    if ctx.invoked_subcommand is None:
        with session(server, token) as gp:
            found = gp.tokens(user)
            _show(found, render.tokens_table(found, SystemClock().now()), json_out)


@tokens_app.command("create")
def tokens_create(  # noqa: PLR0917 - typer options
    user: Annotated[str | None, typer.Option(help="whose token (default: yours)")] = None,
    name: Annotated[str, typer.Option(help="a label, e.g. laptop")] = "",
    ttl: Annotated[str | None, typer.Option(help="lifetime, e.g. 90d (default: no expiry)")] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="print only the secret (for scripts)")
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a token and show its secret, this once.

    Example: gpupool tokens create --user alice --ttl 90d
    """
    with handle_errors():
        ttl_s = parse_duration(ttl, field="--ttl") if ttl else None
    with session(server, token) as gp:
        issued = gp.create_token(user, name, ttl_s)
        if json_out:
            print_json(issued)
            return
        if quiet:
            typer.echo(issued.secret)
            return
        typer.echo(f"token {issued.id} for {issued.user}; the secret is shown only now:")
        typer.echo(issued.secret)
        typer.echo(
            f"use it with: gpupool login --token {issued.secret[:8]}... or GPUPOOL_TOKEN", err=True
        )


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="token id (gpupool tokens lists them)")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token now.  Example: gpupool tokens revoke 3f2a9c1d0b7e"""
    with session(server, token) as gp:
        gp.revoke_token(token_id)
        typer.echo(f"token {token_id} revoked")


def audit(  # noqa: PLR0917 - typer options
    since: Annotated[
        str, typer.Option("-S", "--since", help="how far back: 1d, 12h, 90 (minutes)")
    ] = "1d",
    user: Annotated[
        str | None, typer.Option("-u", "--user", help="only calls by this user")
    ] = None,
    action: Annotated[
        str | None, typer.Option("-a", "--action", help="only this action or prefix: job, token")
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", help="only calls on this object (job id, name)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many rows (1-1000)")] = 100,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the audit log: every mutating call, who made it, when, from where, how it ended.

    Admins and operators only. Newest first.

    Examples:

      gpupool audit -S 7d -u alice

      gpupool audit -a token --json

      gpupool audit --target 3f2a9c1d0b7e
    """
    with handle_errors():
        window = parse_duration(since, field="--since")
    if not 1 <= limit <= 1000:
        raise fail(f"--limit {limit}: give a number from 1 to 1000")
    with session(server, token) as gp:
        now = SystemClock().now()
        rows = gp.audit(since=now - window, user=user, action=action, target=target, limit=limit)
        if json_out:
            print_json(rows)
            return
        emit(render.audit_table(rows))


def install(app: typer.Typer) -> None:
    for group in (pools_app, tenants_app, quota_app, classes_app, users_app, tokens_app):
        app.add_typer(group)
    app.command(name="audit")(audit)
