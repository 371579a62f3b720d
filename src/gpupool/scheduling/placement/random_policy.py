"""Random placement: the FGD paper's weakest baseline.

Picks a node uniformly among those where the replica fits, and for a GPU share a GPU uniformly
among those that can hold it; whole GPUs are taken in index order. The randomness comes from the
seed in :class:`~gpupool.scheduling.placement.registry.PolicyOptions`, so a run is repeatable.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    PolicyOptions,
    Shape,
    best_fit_slots,
)


class RandomPolicy:
    """Uniform node, uniform GPU for a share."""

    name: ClassVar[str] = "random"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self._rng = np.random.default_rng((options or PolicyOptions()).seed)

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        nodes = np.flatnonzero(feasible)
        if len(nodes) == 0:
            return None
        node = int(nodes[self._rng.integers(len(nodes))])
        if shape.is_sharing:
            gpus = np.flatnonzero(capacity.slot_fits(shape)[node])
            return Choice(node=node, slots=(int(gpus[self._rng.integers(len(gpus))]),))
        return Choice(node=node, slots=best_fit_slots(capacity, shape, node))
