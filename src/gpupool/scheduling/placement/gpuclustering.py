"""GpuClustering: the FGD paper's baseline that groups replicas of the same kind on a node.

A replica's **affinity** is its GPU kind: ``share`` (a fraction of one GPU) or ``k-gpu`` (k whole
GPUs); CPU-only replicas have none and score 0. A node's affinities are the kinds of the
replicas placed on it. Bands of the authors' integer score, best first:

- 75..100: the node holds only this kind;  50..75: it holds this kind and others;
- 25..50: it holds nothing yet;             0..25: it holds other kinds only;

and within a band ``25 * (8000 - free GPU milli of the node) // 8000``, so fuller nodes win.
Ties go to the lowest node row; a share takes the best-fit GPU.

The arrays do not say which replicas run where, so the policy remembers the kinds it placed, per
node. A placement it proposed counts once the node's free capacity has changed; a node whose GPUs
are all free again forgets its kinds (its replicas have left).
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
    best_fit_slots,
)
from gpupool.scheduling.placement.dotprod import MAX_SPEC_GPU_MILLI


def affinity(shape: Shape) -> str | None:
    """``"share"``, ``"<k>-gpu"`` or ``None`` for a CPU-only replica."""
    if shape.count == 0:
        return None
    return "share" if shape.is_sharing else f"{shape.count}-gpu"


class GpuClusteringPolicy:
    """Place a replica with replicas of its own kind."""

    name: ClassVar[str] = "gpuclustering"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()
        self._columns: dict[str, int] = {}
        self._counts = np.zeros((0, 0), dtype=np.int64)  # [N, kinds] replicas of each kind
        self._pending: tuple[int, str, IntArray, int] | None = None

    learns: ClassVar[bool] = False  # observe does nothing

    def observe(self, shape: Shape) -> None:
        return None

    def _column(self, kind: str) -> int:
        if kind not in self._columns:
            self._columns[kind] = len(self._columns)
            extra = np.zeros((self._counts.shape[0], 1), dtype=np.int64)
            self._counts = np.concatenate([self._counts, extra], axis=1)
        return self._columns[kind]

    def _settle(self, capacity: CapacityArrays) -> None:
        n = capacity.num_nodes
        if self._counts.shape[0] != n:
            self._counts = np.zeros((n, len(self._columns)), dtype=np.int64)
            self._pending = None
        if self._pending is not None:
            node, kind, free_before, cpu_before = self._pending
            if (
                not np.array_equal(capacity.free_milli[node], free_before)
                or capacity.cpu_free[node] != cpu_before
            ):
                column = self._column(kind)
                self._counts[node, column] += 1
            self._pending = None
        all_free = ((capacity.free_milli == MILLI_PER_GPU) | ~capacity.usable).all(axis=1)
        self._counts[all_free] = 0

    def scores(self, capacity: CapacityArrays, shape: Shape) -> IntArray:
        """The integer GpuClustering score of every node (feasibility not applied)."""
        n = capacity.num_nodes
        kind = affinity(shape)
        if kind is None:
            return np.zeros(n, dtype=np.int64)
        free = np.where(capacity.usable, capacity.free_milli, 0).sum(axis=1)
        fill = 25 * np.maximum(MAX_SPEC_GPU_MILLI - free, 0) // MAX_SPEC_GPU_MILLI
        if self._counts.shape[0] != n:
            fresh: IntArray = fill + 25
            return fresh
        kinds = (self._counts > 0).sum(axis=1)
        col = self._columns.get(kind)
        has = self._counts[:, col] > 0 if col is not None else np.zeros(n, dtype=np.bool_)
        band = np.where(kinds == 0, 25, np.where(has, np.where(kinds == 1, 75, 50), 0))
        result: IntArray = fill + band
        return result

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        self._settle(capacity)
        if not feasible.any():
            return None
        scores = np.where(feasible, self.scores(capacity, shape), -1)
        node = int(np.argmax(scores))
        kind = affinity(shape)
        if kind is not None:
            before = capacity.free_milli[node].copy()
            self._pending = (node, kind, before, int(capacity.cpu_free[node]))
        return Choice(node=node, slots=best_fit_slots(capacity, shape, node))
