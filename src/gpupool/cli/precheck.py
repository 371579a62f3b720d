"""``gpupool precheck``: is this machine ready to run or reach a pool? One line per check.

Each check returns a :class:`Check`: ``PASS``, ``WARN`` (works, but something a GPU node would
need is missing; with what to do), ``FAIL`` (with what to do) or ``SKIP`` (does not apply, e.g.
MIG without a driver). Checks are registered by name in :data:`CHECKS`, in the order they run;
the command exits 1 when any check failed, never for a warning.

- ``driver``: NVML loads and sees GPUs (through :class:`gpupool.gpu.nvml.NvmlBackend`). Without
  a driver it warns: a client machine, or a simulated pool (``gpupool up --simulate``, an
  agent's ``--simulate``), works without one;
- ``cuda-visible``: ``CUDA_VISIBLE_DEVICES`` does not hide every GPU, and ``/dev/nvidia*`` exist;
- ``mps``: ``nvidia-cuda-mps-control`` is on ``PATH`` (needed for the ``mps`` isolation mode);
- ``mig``: which GPUs have MIG mode on;
- ``containers``: the container engines (podman, docker) ``--image`` jobs can use, and what
  each missing one lacks (the agent reports the same at registration);
- ``disk``: at least 1 GiB free under ``$GPUPOOL_HOME`` (logs, checkpoints, SQLite);
- ``server``: the server answers ``/healthz``;
- ``token``: the token is accepted (``/v1/whoami``).
"""

from __future__ import annotations

import enum
import glob
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.session import JsonOpt, ServerOpt, TokenOpt, handle_errors, print_json
from gpupool.client.config import gpupool_home
from gpupool.client.errors import ClientError
from gpupool.client.sdk import Client
from gpupool.containers.engines import detect, write_containers_conf

MIN_FREE_MIB = 1024


class Status(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Context:
    """What the checks share: the client, and NVML's inventory once opened."""

    client: Client
    home: Path
    gpus: list[tuple[str, bool | None]] | None = None  # (name, mig enabled); None = no driver
    driver_error: str = ""


def check_driver(ctx: Context) -> Check:
    from gpupool.gpu.base import GpuUnavailable
    from gpupool.gpu.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except GpuUnavailable as exc:
        ctx.driver_error = str(exc)
        return Check(
            "driver",
            Status.WARN,
            f"{exc}: fine for a client or a simulated pool, not for a GPU node",
            "install the NVIDIA driver on GPU nodes; without one, run the agent with "
            "--simulate 4xA100-80GB",
        )
    try:
        ctx.gpus = [(d.name, d.mig_enabled) for d in backend.inventory()]
    finally:
        backend.close()
    names = ", ".join(sorted({n for n, _ in ctx.gpus}))
    return Check("driver", Status.PASS, f"NVML sees {len(ctx.gpus)} GPU(s): {names}")


def check_cuda_visible(ctx: Context) -> Check:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    nodes = glob.glob("/dev/nvidia[0-9]*")
    if value is not None and value.strip() in ("", "-1", "none", "NoDevFiles"):
        return Check(
            "cuda-visible",
            Status.FAIL,
            f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU",
            "unset CUDA_VISIBLE_DEVICES for the agent: gpupool sets it per job",
        )
    if not nodes:
        return Check(
            "cuda-visible",
            Status.FAIL if ctx.gpus else Status.SKIP,
            "no /dev/nvidia* device files",
            "load the NVIDIA kernel module (nvidia-smi creates the files), or pass the devices "
            "into the container",
        )
    shown = "unset" if value is None else repr(value)
    return Check("cuda-visible", Status.PASS, f"{len(nodes)} device file(s); variable {shown}")


def check_mps(ctx: Context) -> Check:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        return Check(
            "mps",
            Status.FAIL if ctx.gpus else Status.SKIP,
            "nvidia-cuda-mps-control not on PATH (isolation 'mps' unavailable)",
            "install the CUDA MPS tools (part of the NVIDIA driver utilities) for hard slices",
        )
    return Check("mps", Status.PASS, f"MPS control at {path}")


def check_mig(ctx: Context) -> Check:
    if not ctx.gpus:
        return Check("mig", Status.SKIP, "no GPU to ask about MIG")
    on = [n for n, mig in ctx.gpus if mig]
    capable = [n for n, mig in ctx.gpus if mig is not None]
    if on:
        return Check("mig", Status.PASS, f"MIG on for {len(on)} of {len(ctx.gpus)} GPU(s)")
    return Check(
        "mig",
        Status.PASS,
        f"MIG off ({len(capable)} GPU(s) support it; enable with nvidia-smi -mig 1)",
    )


def check_disk(ctx: Context) -> Check:
    folder = ctx.home
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free_mib = shutil.disk_usage(folder).free // (1024 * 1024)
    if free_mib < MIN_FREE_MIB:
        return Check(
            "disk",
            Status.FAIL,
            f"only {free_mib / 1024:.1f} GiB free under {ctx.home}",
            "free some space or point GPUPOOL_HOME at a bigger disk",
        )
    return Check("disk", Status.PASS, f"{free_mib / 1024:.1f} GiB free under {ctx.home}")


def check_server(ctx: Context) -> Check:
    src = ctx.client.resolved.server_source
    try:
        ctx.client.request("GET", "/healthz")
        version = ctx.client.version()
    except ClientError as exc:
        return Check("server", Status.FAIL, f"{ctx.client.server} ({src}): {exc}", "")
    return Check("server", Status.PASS, f"{ctx.client.server} answers, gpupool {version} ({src})")


def check_token(ctx: Context) -> Check:
    if not ctx.client.resolved.token:
        return Check(
            "token", Status.FAIL, "no token found", "run gpupool login, or set GPUPOOL_TOKEN"
        )
    try:
        who = ctx.client.whoami()
    except ClientError as exc:
        return Check("token", Status.FAIL, str(exc), "")
    tenant = f", tenant {who.tenant}" if who.tenant else ""
    return Check(
        "token",
        Status.PASS,
        f"accepted: user {who.user}, role {who.role}{tenant} ({ctx.client.resolved.token_source})",
    )


def check_containers(ctx: Context) -> Check:
    """The container engines ``--image`` jobs can use here, run as the agent runs them (its
    ``containers.conf``), and what each missing one lacks."""
    with tempfile.TemporaryDirectory() as folder:
        conf = write_containers_conf(Path(folder))
        env = {"PATH": os.environ.get("PATH", ""), "CONTAINERS_CONF": str(conf)}
        checks = detect(env, deep=True)
    have = [f"{c.name} {c.version or ''}".strip() for c in checks if c.available]
    lacking = "; ".join(f"{c.name}: {c.missing}" for c in checks if not c.available)
    if not have:
        return Check(
            "containers",
            Status.WARN,
            f"no container engine: --image jobs cannot run here ({lacking})",
            "install podman and runc (docs/deploy.md, 'Container jobs') to run jobs in images",
        )
    detail = f"engines: {', '.join(have)}" + (f" (missing: {lacking})" if lacking else "")
    return Check("containers", Status.PASS, detail)


#: Every check, by name, in the order it runs.
CHECKS: dict[str, Callable[[Context], Check]] = {
    "driver": check_driver,
    "cuda-visible": check_cuda_visible,
    "mps": check_mps,
    "mig": check_mig,
    "containers": check_containers,
    "disk": check_disk,
    "server": check_server,
    "token": check_token,
}


def precheck(
    only: Annotated[
        list[str] | None, typer.Option("--only", help=f"run only these: {', '.join(CHECKS)}")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            help="also check the cluster for gpupool's DRA driver: API, DRA, consumable "
            "capacity, DeviceClass, this node's kubelet plugin, CDI (gpupool.kube.precheck)",
        ),
    ] = False,
) -> None:
    """Check this machine: NVIDIA driver and NVML, CUDA visibility, MPS, MIG, disk, server, token.

    Prints PASS / WARN / FAIL / SKIP per line with what to do about warnings and failures;
    exits 1 if any check failed (a warning alone exits 0: no driver is fine for a client or a
    simulated pool).

    Examples:

      gpupool precheck

      gpupool precheck --only server --only token

      gpupool precheck --kubernetes     # on a Kubernetes node (KUBECONFIG, NODE_NAME)
    """
    names = only or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise typer.BadParameter(f"unknown check {unknown[0]!r}: use {', '.join(CHECKS)}")
    with handle_errors():
        client = Client(server, token)
    try:
        ctx = Context(client, gpupool_home())
        if "driver" not in names and any(n in names for n in ("mps", "mig", "cuda-visible")):
            check_driver(ctx)
        results = [CHECKS[n](ctx) for n in CHECKS if n in names]
    finally:
        client.close()
    if kubernetes:
        from gpupool.kube.precheck import run_checks

        results += [Check(k.name, Status(k.status), k.detail, k.fix) for k in run_checks()]
    if json_out:
        print_json([r.__dict__ | {"status": r.status.value} for r in results])
    else:
        for r in results:
            line = f"{r.status.value:4}  {r.name:12}  {r.detail}"
            fix = r.fix and r.status in (Status.FAIL, Status.WARN)
            typer.echo(line + (f"\n      {'':12}  fix: {r.fix}" if fix else ""))
    if any(r.status is Status.FAIL for r in results):
        raise typer.Exit(1)


def install(app: typer.Typer) -> None:
    app.command(name="precheck")(precheck)
