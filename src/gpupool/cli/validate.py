"""``gpupool validate``: check a job file without submitting it (like ``sbatch --test-only``).

Two levels, and the output says which was done:

- **the file**: parsed and checked by :func:`gpupool.domain.jobspec.parse_job_yaml`, the rules
  ``submit`` and the server apply to every job file (keys, sizes, shares, reserved variables);
- **against the server**, when one is reachable with a token (the same discovery as every
  command: ``--server``, ``$GPUPOOL_SERVER``, ``gpupool login``'s file, a local pool): what the
  server's submit checks beyond the file, read through the API without writing anything. The
  job's tenant (the file's ``tenant``, else the caller's, else ``default``) must exist and be
  one the caller may submit to, its pool and priority class must exist.

With no server reachable, or ``--offline``, only the file is checked, and the ``ok`` line
says so. Exit codes: 0 ok, 1 the job would be refused, 2 the file cannot be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.session import ServerOpt, TokenOpt
from gpupool.client.errors import ApiError, ClientError, ConfigError, ServerUnreachable
from gpupool.client.sdk import Client
from gpupool.domain.errors import SpecError
from gpupool.domain.jobs import JobSpec
from gpupool.domain.jobspec import parse_job_yaml
from gpupool.domain.units import format_duration, format_gpus, format_memory

#: The tenant of a job that names none, submitted by a user who has none (the server's rule).
DEFAULT_TENANT = "default"
#: The permission that lets a role submit to any tenant (admins, operators).
ANY_TENANT = "job:read-any"


def server_problems(gp: Client, spec: JobSpec) -> list[str]:
    """What the server would refuse in ``spec`` beyond the file's own rules (read only)."""
    who = gp.whoami()
    problems: list[str] = []
    tenant = spec.tenant or who.tenant or DEFAULT_TENANT
    if spec.tenant is not None and ANY_TENANT not in who.permissions and tenant != who.tenant:
        problems.append(
            f"tenant: you ({who.user}) may submit jobs only to your tenant {who.tenant}: remove "
            f"'tenant: {spec.tenant}' or ask an admin"
        )
    else:
        try:
            gp.tenant(tenant)
        except ApiError as exc:
            if exc.status != 404:
                raise
            problems.append(f"tenant: {tenant!r} does not exist: ask an admin to create it")
    pools = sorted(p.name for p in gp.pools())
    if spec.pool not in pools:
        problems.append(f"pool: {spec.pool!r} does not exist: use one of {', '.join(pools)}")
    classes = {c.name: c.value for c in gp.priority_classes()}
    if spec.priority_class not in classes:
        names = ", ".join(sorted(classes, key=classes.__getitem__))
        problems.append(
            f"priority: class {spec.priority_class!r} does not exist: use one of {names}"
        )
    return problems


def validate(
    job_file: Annotated[Path, typer.Argument(help="YAML job file to check")],
    offline: Annotated[
        bool, typer.Option("--offline", help="check the file only, never ask a server")
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Check a job file without submitting it (like ``sbatch --test-only``).

    The file's own rules always; then, when a server is reachable, what its submit would
    refuse (tenant, pool, priority class). The last line says which checks were done.

    Examples:

      gpupool validate examples/train.yaml

      gpupool validate --offline examples/train.yaml
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
    if offline:
        checked = "the file only (--offline)"
    else:
        checked, refusals = _against_server(spec, server, token)
        for refusal in refusals:
            typer.echo(f"error: {job_file}: {refusal}", err=True)
        if refusals:
            typer.echo(f"the server at {checked} would refuse this job", err=True)
            raise typer.Exit(1)
    res = spec.resources
    mem = format_memory(res.gpu_memory_mib) if res.gpu_memory_mib is not None else "share"
    limit = format_duration(spec.time_limit_s) if spec.time_limit_s is not None else "pool"
    typer.echo(
        f"ok: {spec.name}: {spec.replicas} x {format_gpus(res.gpu_milli)} GPU, "
        f"gpu memory {mem}, pool {spec.pool}, priority {spec.priority_class}, "
        f"time limit {limit}\nchecked: {checked}"
    )


def _against_server(spec: JobSpec, server: str | None, token: str | None) -> tuple[str, list[str]]:
    """(what was checked, the server's refusals); the file only when no server answers."""
    try:
        gp = Client(server, token)
    except ConfigError as exc:
        return f"the file only (no server to ask: {exc})", []
    try:
        problems = server_problems(gp, spec)
    except ServerUnreachable as exc:
        return f"the file only ({exc})", []
    except ClientError as exc:
        return f"the file only (the server at {gp.server} did not answer the checks: {exc})", []
    finally:
        gp.close()
    if problems:
        return gp.server, problems
    return f"the file and the server at {gp.server} (tenant, pool, priority class)", []


def install(app: typer.Typer) -> None:
    app.command(name="validate")(validate)
