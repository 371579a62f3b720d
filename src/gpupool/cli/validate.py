"""``gpupool validate``: check a job file without submitting it (like ``sbatch --test-only``)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool.domain.errors import SpecError
from gpupool.domain.jobspec import parse_job_yaml
from gpupool.domain.units import format_duration, format_gpus, format_memory


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


def install(app: typer.Typer) -> None:
    app.command(name="validate")(validate)
