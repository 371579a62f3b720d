"""``spread``: put each replica on the node it leaves emptiest.

The opposite of ``bestfit``: the feasible node with the most GPU and CPU left over (same score,
highest wins; lowest row on ties). A share goes to the fitting GPU with the most free milli, so
shares spread over GPUs too; whole GPUs are taken in index order. Good for latency-sensitive
work that suffers from neighbours, bad for fragmentation.
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
from gpupool.scheduling.placement.bestfit import leftover_score


class Spread:
    """Spread: the feasible node with the most GPU and CPU left over."""

    name: ClassVar[str] = "spread"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        if not feasible.any():
            return None
        score = leftover_score(capacity, shape, feasible)
        score[~feasible] = -np.inf
        node = int(np.argmax(score))
        if shape.is_sharing:
            fits = capacity.slot_fits_on_node(shape, node)
            idx = np.flatnonzero(fits)
            free = capacity.free_milli[node, idx]
            return Choice(node, (int(idx[int(np.argmax(free))]),))
        return Choice(node, best_fit_slots(capacity, shape, node))

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None
