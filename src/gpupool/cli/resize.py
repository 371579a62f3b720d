"""``gpupool resize``: change a running shim job's slice in place (control/services/resize.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli.session import JsonOpt, ServerOpt, TokenOpt, print_json, session
from gpupool.domain.units import format_gpus, format_memory


def resize(  # noqa: PLR0917 - typer options
    job_id: Annotated[str, typer.Argument(help="job id")],
    gpu_mem: Annotated[
        str | None, typer.Option("--gpu-mem", help="GPU memory per device, e.g. 30GiB")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("-g", "--gpus", help="share of each device, e.g. 0.5")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Resize a running job's GPU slice in place (isolation shim only).

    Examples:

      gpupool resize 3f2a9c1d0b7e --gpu-mem 30GiB -g 0.5

      gpupool resize 3f2a9c1d0b7e --gpu-mem 12GiB

    Admitted like a new request: each device must have room beside its other slices and the
    tenant's quota must hold (exit 6 otherwise). Running processes see the new limits at their
    next allocation and launch; a smaller memory limit takes nothing back, it refuses new
    allocations until usage falls under it. The change is audited and shown in `gpupool show`.
    """
    with session(server, token) as gp:
        job = gp.resize(job_id, gpus=gpus, gpu_memory=gpu_mem)
        if json_out:
            print_json(job)
            return
        sizes = {(s.milli, s.memory_mib) for s in job.slices}
        text = ", ".join(f"{format_gpus(m)} GPU and {format_memory(mem)}" for m, mem in sizes)
        typer.echo(f"job {job.id} ({job.name}): now {text} per device")


def install(app: typer.Typer) -> None:
    app.command(name="resize")(resize)
