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


def leftover_score(capacity: CapacityArrays, shape: Shape, rows: np.ndarray) -> np.ndarray:
    """Fraction of GPU share plus fraction of CPU that ``rows`` keep free after ``shape``."""
    free = np.where(capacity.usable[rows], capacity.free_milli[rows], 0).sum(axis=1)
    gpus = np.maximum(capacity.gpu_count[rows], 1) * MILLI_PER_GPU
    cpu_total = np.maximum(capacity.cpu_total[rows], 1)
    gpu_left = (free - shape.total_milli) / gpus
    cpu_left = (capacity.cpu_free[rows] - shape.cpu_milli) / cpu_total
    score: np.ndarray = gpu_left + cpu_left
    return score


class BestFit:
    """Pack: the feasible node with the least GPU and CPU left over."""

    name: ClassVar[str] = "bestfit"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        rows = np.flatnonzero(feasible)
        if len(rows) == 0:
            return None
        node = int(rows[int(np.argmin(leftover_score(capacity, shape, rows)))])
        return Choice(node, best_fit_slots(capacity, shape, node))

    def observe(self, shape: Shape) -> None:
        return None
