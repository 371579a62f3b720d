"""``bestfit``: bin-pack each replica onto the node it leaves fullest.

Score of a feasible node (lower is better): the GPU share it would have left, as a fraction of
its GPUs, plus the CPU it would have left, as a fraction of its CPUs. Ties go to the lowest node
row, which keeps packing stable from cycle to cycle. A share goes to the fitting GPU with the
least free milli; whole GPUs are taken in index order (:func:`best_fit_slots`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    PolicyOptions,
    Shape,
    best_fit_slots,
)


def leftover_score(capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> np.ndarray:
    """[N] fraction of GPU share plus fraction of CPU each node keeps free after ``shape``;
    +inf for nodes outside ``feasible`` (so ``argmin`` never picks them)."""
    free = np.einsum("ij,ij->i", capacity.free_milli, capacity.usable)  # fast masked row sum
    gpus = np.maximum(capacity.gpu_count, 1) * MILLI_PER_GPU
    cpu_total = np.maximum(capacity.cpu_total, 1)
    score: np.ndarray = (free - shape.total_milli) / gpus + (
        capacity.cpu_free - shape.cpu_milli
    ) / cpu_total
    score[~feasible] = np.inf
    return score


class BestFit:
    """Pack: the feasible node with the least GPU and CPU left over."""

    name: ClassVar[str] = "bestfit"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        if not feasible.any():
            return None
        node = int(np.argmin(leftover_score(capacity, shape, feasible)))
        return Choice(node, best_fit_slots(capacity, shape, node))

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None
