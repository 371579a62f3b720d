"""Builders for tiny hand-made clusters and shapes used by the packing tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.scheduling.placement.base import CapacityArrays, Shape

BIG_MIB = 1 << 30


def cluster(
    free: Sequence[Sequence[int]],
    cpu: Sequence[int] | None = None,
    models: Sequence[int] | None = None,
    model_names: tuple[str, ...] = ("A", "B"),
) -> CapacityArrays:
    """Nodes whose GPUs have the given free milli (ragged rows are padded, padding unusable)."""
    width = max(len(row) for row in free)
    n = len(free)
    usable = np.zeros((n, width), dtype=np.bool_)
    free_milli = np.zeros((n, width), dtype=np.int64)
    for i, row in enumerate(free):
        usable[i, : len(row)] = True
        free_milli[i, : len(row)] = row
    mem = np.where(usable, BIG_MIB, 0).astype(np.int64)
    cpu_arr = np.asarray(cpu if cpu is not None else [64_000] * n, dtype=np.int64)
    return CapacityArrays(
        node_names=tuple(f"n{i}" for i in range(n)),
        model_names=model_names,
        node_model=np.asarray(models if models is not None else [0] * n, dtype=np.int64),
        free_milli=free_milli,
        free_mem=mem.copy(),
        total_mem=mem,
        usable=usable,
        cpu_free=cpu_arr,
        host_mem_free=np.full(n, BIG_MIB, dtype=np.int64),
        cpu_total=np.full(n, max(int(cpu_arr.max()), 1), dtype=np.int64),
    )


def share(milli: int, cpu: int = 0, models: tuple[bool, ...] | None = None) -> Shape:
    return Shape(milli=milli, count=1, memory_mib=0, cpu_milli=cpu, models=models)


def whole(count: int, cpu: int = 0) -> Shape:
    return Shape(milli=1000, count=count, memory_mib=0, cpu_milli=cpu)


def cpu_only(cpu: int) -> Shape:
    return Shape(milli=0, count=0, memory_mib=0, cpu_milli=cpu)
