"""GpuPacking: the FGD paper's packing baseline.

Three tiers, best first, each with the authors' integer score:

1. the replica fits on GPUs already in use: ``100 - (sum of their free percent) / 10``, >= 50;
2. it needs fully free GPUs of a node already in use: ``50 - (free GPUs it takes)``, >= 33;
3. the node is entirely free: ``max(33 - GPUs of the node, GPUs of the node)``.

A CPU-only replica scores 0 everywhere. GPUs are taken least-free first (best fit); ties between
nodes go to the lowest row.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    IntArray,
    PolicyOptions,
    Shape,
    best_scored_choice,
)
from gpupool.scheduling.placement.fgd import after_placement


def gpupacking_scores(capacity: CapacityArrays, shape: Shape) -> IntArray:
    """The integer GpuPacking score of every node for ``shape`` (feasibility not applied)."""
    n = capacity.num_nodes
    if shape.total_milli == 0:
        return np.zeros(n, dtype=np.int64)
    free = np.where(capacity.usable, capacity.free_milli, 0)
    gpus = capacity.usable.sum(axis=1)
    fully_free = (capacity.usable & (free == MILLI_PER_GPU)).sum(axis=1)
    fits = capacity.slot_fits(shape)
    _, taken = after_placement(free, fits, shape)
    taken_bool = taken.astype(np.bool_)
    full_taken = (taken_bool & (free == MILLI_PER_GPU)).sum(axis=1)
    ratio_sum = np.where(taken_bool, free * 100 // MILLI_PER_GPU, 0).sum(axis=1)
    tier1 = np.maximum(100 - ratio_sum // 10, 50)
    tier2 = np.maximum(50 - full_taken, 33)
    tier3 = np.maximum(33 - fully_free, fully_free)
    scores: IntArray = np.where(fully_free == gpus, tier3, np.where(full_taken > 0, tier2, tier1))
    return scores


class GpuPackingPolicy:
    """Prefer GPUs in use, then nodes in use, then free nodes."""

    name: ClassVar[str] = "gpupacking"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        return best_scored_choice(capacity, shape, feasible, gpupacking_scores(capacity, shape))
