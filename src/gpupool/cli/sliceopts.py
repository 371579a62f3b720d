"""The options that ask for a slice, shared by ``submit``/``run`` (sbatch, srun) and
``alloc`` (salloc), so that each is spelled and explained once. Types only: no imports
beyond typer (``tests/cli/test_startup.py``)."""

from __future__ import annotations

from typing import Annotated

import typer

GpusOpt = Annotated[
    str | None, typer.Option("-g", "--gpus", help="GPU share: 0.5, 50%, 500m, or whole: 2")
]
GpuMemOpt = Annotated[
    str | None, typer.Option("--gpu-mem", help="GPU memory per device, e.g. 10GiB")
]
CpusOpt = Annotated[str | None, typer.Option("-c", "--cpus", help="host CPUs, e.g. 4")]
MemOpt = Annotated[str | None, typer.Option("--mem", help="host memory, e.g. 32GiB")]
PoolOpt = Annotated[str | None, typer.Option("-p", "--pool", help="pool (partition)")]
AccountOpt = Annotated[
    str | None, typer.Option("-A", "--account", help="tenant to charge (default: yours)")
]
