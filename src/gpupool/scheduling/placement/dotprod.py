"""DotProd: Tetris-style alignment scoring, as the FGD paper's baseline configures it.

A node's free vector ``(cpu free, total GPU milli free)`` and the replica's request vector
``(cpu, GPU milli)`` are both divided by the largest node spec (128 CPUs, 8 GPUs); the score is
``int(100 * (1 - dot / 2))``, so the node whose free resources align *least* with the request
(the fuller node) wins. Ties go to the lowest node row; a share takes the best-fit GPU.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    IntArray,
    PolicyOptions,
    Shape,
    best_scored_choice,
)

#: The authors' normalisation: the largest node spec in the trace.
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


def dotprod_scores(capacity: CapacityArrays, shape: Shape) -> IntArray:
    """The integer DotProd score of every node for ``shape`` (feasibility not applied)."""
    gpu_free = np.where(capacity.usable, capacity.free_milli, 0).sum(axis=1)
    dot = (capacity.cpu_free / MAX_SPEC_CPU_MILLI) * (shape.cpu_milli / MAX_SPEC_CPU_MILLI) + (
        gpu_free / MAX_SPEC_GPU_MILLI
    ) * (shape.total_milli / MAX_SPEC_GPU_MILLI)
    scores: IntArray = (100.0 * (1.0 - dot / 2.0)).astype(np.int64)
    return scores


class DotProdPolicy:
    """Highest integer DotProd score; lowest row on ties."""

    name: ClassVar[str] = "dotprod"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        return best_scored_choice(capacity, shape, feasible, dotprod_scores(capacity, shape))
