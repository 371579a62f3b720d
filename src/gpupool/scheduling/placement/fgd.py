"""FGD: Fragmentation Gradient Descent placement (Weng et al., USENIX ATC 2023).

FGD puts a replica on the node, and for a GPU share on the GPU, whose fragmentation ``F``
(:mod:`.fragmentation`) grows least. As published, each placement gets the integer score
``int(sigmoid(dF / 1000) * 100)`` where ``dF`` is how much the node's ``F`` *drops*; the
highest score wins and ties go to the lowest node row (the caller's node order). The integer
score is part of the algorithm's behaviour: many nodes tie, and the fixed tie order packs nodes
one after another like first-fit.

The published FGD reads the whole trace first to build its shape distribution. Here the
distribution is given with :meth:`FGDPolicy.know_trace` (the packing experiment does that, as
the authors' simulator does); a live scheduler that never calls it gets the distribution of
the shapes it has been shown with ``observe`` (all of them, counted equally, rebuilt whenever
their number grew by a tenth).

Words:

- **delta** ``dF``: ``F(node now) - F(node after the placement)``, in milli-GPU (higher is better).
- **score cache** (:class:`FragScoreCache`): per shape key, the best delta and GPU of every node,
  kept until that node's free capacity changes or the distribution changes, so each placement
  recomputes only the rows that the previous placements touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

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
from gpupool.scheduling.placement.fragmentation import (
    FloatArray,
    ShapeDistribution,
    ShapeKey,
    node_fragmentation,
    shape_key,
)

#: Delta of a candidate that is not possible (a GPU that cannot hold the share).
IMPOSSIBLE = -np.inf

#: From this many rows to evaluate at once, identical node states are evaluated once each.
DEDUPE_ROWS = 64
#: Odd 62-bit multipliers for :func:`distinct_rows` (fixed: same hashes every run).
_ROW_WEIGHTS = np.random.default_rng(0x9E3779B9).integers(1, 2**62, size=256, dtype=np.int64) | 1


def distinct_rows(state: IntArray) -> tuple[IntArray, IntArray]:
    """``first`` (one row index per distinct row) and ``inverse`` (each row's entry in
    ``first``), like ``np.unique(state, axis=0, return_index=True, return_inverse=True)``.

    Rows are hashed to one int64 each (a weighted sum, wrapping) and the hashes deduplicated,
    which is several times cheaper than ``np.unique`` over rows; the result is then checked
    row by row, and a hash collision falls back to the exact ``np.unique``."""
    rows = np.ascontiguousarray(state, dtype=np.int64)
    if rows.shape[1] > len(_ROW_WEIGHTS):
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    hashes = rows @ _ROW_WEIGHTS[: rows.shape[1]]
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not np.array_equal(rows[first][inverse], rows):
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    return first, inverse


@runtime_checkable
class TraceInformed(Protocol):
    """A policy that, as published, learns its shape distribution from the whole trace first."""

    def know_trace(self, shapes: Iterable[Shape], num_models: int) -> None:
        """Fix the distribution to the one of ``shapes`` (all pods of the trace)."""
        ...


def paper_score(delta: FloatArray, levels: float = 100.0) -> IntArray:
    """The authors' integer FGD score of a fragmentation drop ``delta`` (milli-GPU).

    ``levels`` is the score's top (the authors' 100); fewer levels make more nodes tie.
    """
    with np.errstate(over="ignore"):
        scores: IntArray = (levels / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)
    return scores


def after_placement(free: IntArray, fits: BoolArray, shape: Shape) -> tuple[IntArray, IntArray]:
    """Free milli of rows ``free`` [K, G] after ``shape`` takes its slots, and the slots' mask.

    Shares and whole GPUs both take the fitting GPUs with least free milli (lowest index on
    ties), as the authors' ``NodeResource.Sub`` does; rows where it does not fit are unchanged.
    """
    key = np.where(fits, free, np.iinfo(np.int64).max)
    order = np.argsort(key, axis=1, kind="stable")[:, : shape.count]
    taken = np.zeros(free.shape, dtype=np.bool_)
    np.put_along_axis(taken, order, True, axis=1)
    taken &= fits
    new_free: IntArray = free - np.where(taken, shape.milli, 0)
    return new_free, taken.astype(np.int64)


@dataclass
class _ShapeEntry:
    delta: FloatArray  # [N] best fragmentation drop (IMPOSSIBLE where unknown or infeasible)
    gpu: IntArray  # [N] best GPU for a share (-1 otherwise)
    version: IntArray  # [N] node version the row was computed at (-1 = never)


@dataclass
class FragScoreCache:
    """Per-node fragmentation and per-(node, shape) best deltas, refreshed only where stale.

    The cache watches the arrays it is given: rows whose free milli, free memory or free CPU
    differ from its last copy get a new version, which makes every cached value of the row stale.
    A new distribution (:meth:`set_distribution`) makes everything stale.
    """

    dist: ShapeDistribution | None = None
    _ident: int = 0
    _free: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    _mem: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    _cpu: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _version: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _frag: FloatArray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    _frag_version: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _shapes: dict[tuple[ShapeKey, bool], _ShapeEntry] = field(default_factory=dict)

    def set_distribution(self, dist: ShapeDistribution) -> None:
        self.dist = dist
        self._shapes.clear()
        self._frag_version[:] = -1

    def sync(self, capacity: CapacityArrays) -> None:
        """Bump the version of every row that changed since the last call."""
        if (
            id(capacity) != self._ident
            or self._free.shape != capacity.free_milli.shape
            or self._mem.shape != capacity.free_mem.shape
        ):
            self._ident = id(capacity)
            self._free = capacity.free_milli.copy()
            self._mem = capacity.free_mem.copy()
            self._cpu = capacity.cpu_free.copy()
            n = capacity.num_nodes
            self._version = np.zeros(n, dtype=np.int64)
            self._frag = np.zeros(n, dtype=np.float64)
            self._frag_version = np.full(n, -1, dtype=np.int64)
            self._shapes.clear()
            return
        changed = (
            (capacity.free_milli != self._free).any(axis=1)
            | (capacity.free_mem != self._mem).any(axis=1)
            | (capacity.cpu_free != self._cpu)
        )
        if changed.any():
            rows = np.flatnonzero(changed)
            self._version[rows] += 1
            self._free[rows] = capacity.free_milli[rows]
            self._mem[rows] = capacity.free_mem[rows]
            self._cpu[rows] = capacity.cpu_free[rows]

    def fragmentation(self, capacity: CapacityArrays, rows: IntArray) -> FloatArray:
        """``F`` of ``rows`` now (computed for the stale ones only)."""
        assert self.dist is not None
        stale = rows[self._frag_version[rows] != self._version[rows]]
        if len(stale):
            self._frag[stale] = node_fragmentation(
                capacity.free_milli[stale],
                capacity.usable[stale],
                capacity.cpu_free[stale],
                capacity.node_model[stale],
                self.dist,
            )
            self._frag_version[stale] = self._version[stale]
        result: FloatArray = self._frag[rows]
        return result

    def best(
        self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray, tight: bool = False
    ) -> tuple[FloatArray, IntArray]:
        """Best fragmentation drop and GPU of every node for ``shape``.

        Infeasible nodes get ``IMPOSSIBLE``. For a share the GPU is the one with the best integer
        paper score; ties go to the lowest index or, with ``tight``, to the GPU with the least
        free milli (then the exact drop). The drop returned is that GPU's exact drop. Other shapes
        get GPU -1: their slots come from the best-fit rule.
        """
        assert self.dist is not None
        n = capacity.num_nodes
        key = (shape_key(shape), tight)
        entry = self._shapes.get(key)
        if entry is None:
            entry = _ShapeEntry(
                delta=np.full(n, IMPOSSIBLE),
                gpu=np.full(n, -1, dtype=np.int64),
                version=np.full(n, -1, dtype=np.int64),
            )
            self._shapes[key] = entry
        rows = np.flatnonzero(feasible & (entry.version != self._version))
        if len(rows):
            delta, gpu = self._evaluate(capacity, shape, rows, tight)
            entry.delta[rows] = delta
            entry.gpu[rows] = gpu
            entry.version[rows] = self._version[rows]
        scores: FloatArray = np.where(feasible, entry.delta, IMPOSSIBLE)
        return scores, entry.gpu

    def _evaluate(
        self, capacity: CapacityArrays, shape: Shape, rows: IntArray, tight: bool
    ) -> tuple[FloatArray, IntArray]:
        if len(rows) < DEDUPE_ROWS:
            return self._evaluate_rows(capacity, shape, rows, tight)
        # Rows with the same free milli, usable and fitting slots, CPU and model get the same
        # delta and GPU: evaluate each distinct state once (a fresh cluster has a few dozen).
        state = np.concatenate(
            [
                capacity.free_milli[rows],
                capacity.usable[rows],
                capacity.slot_fits(shape)[rows],
                capacity.cpu_free[rows, None],
                capacity.node_model[rows, None],
            ],
            axis=1,
        )
        first, inverse = distinct_rows(state)
        if len(first) * 2 > len(rows):
            return self._evaluate_rows(capacity, shape, rows, tight)
        delta, gpu = self._evaluate_rows(capacity, shape, rows[first], tight)
        return delta[inverse], gpu[inverse]

    def _evaluate_rows(
        self, capacity: CapacityArrays, shape: Shape, rows: IntArray, tight: bool
    ) -> tuple[FloatArray, IntArray]:
        assert self.dist is not None
        old = self.fragmentation(capacity, rows)
        free = capacity.free_milli[rows]
        usable = capacity.usable[rows]
        cpu = capacity.cpu_free[rows] - shape.cpu_milli
        model = capacity.node_model[rows]
        k, g = free.shape
        none = np.full(k, -1, dtype=np.int64)
        if shape.count == 0:
            delta: FloatArray = old - node_fragmentation(free, usable, cpu, model, self.dist)
            return delta, none
        fits = capacity.slot_fits(shape)[rows]
        if not shape.is_sharing:
            new_free, _ = after_placement(free, fits, shape)
            delta = old - node_fragmentation(new_free, usable, cpu, model, self.dist)
            return delta, none
        eye = np.eye(g, dtype=np.int64) * shape.milli
        cand = free[:, None, :] - eye[None, :, :]  # [K, G(candidate), G(slot)]
        new = node_fragmentation(
            cand,
            np.broadcast_to(usable[:, None, :], cand.shape),
            np.broadcast_to(cpu[:, None], (k, g)),
            np.broadcast_to(model[:, None], (k, g)),
            self.dist,
        )
        exact = np.where(fits, old[:, None] - new, IMPOSSIBLE)
        rank = np.where(fits, paper_score(exact).astype(np.float64), IMPOSSIBLE)
        if tight:
            # Among equal integer scores: least free milli left, then the larger exact drop.
            rank = rank * 1e7 + np.where(fits, (MILLI_PER_GPU - free) * 1e3, 0.0)
            rank += np.where(fits, np.clip(exact, -499.0, 499.0), 0.0)
        gpu = np.argmax(rank, axis=1).astype(np.int64)
        best: FloatArray = exact[np.arange(k), gpu]
        return best, gpu


def shares_choice(capacity: CapacityArrays, shape: Shape, node: int, gpu: int) -> Choice:
    """The choice for ``shape`` at ``node``: the scored GPU for a share, best fit otherwise."""
    if shape.is_sharing and gpu >= 0:
        return Choice(node=node, slots=(gpu,))
    return Choice(node=node, slots=best_fit_slots(capacity, shape, node))


class FGDPolicy:
    """The published FGD: integer paper scores, ties to the lowest node row."""

    name: ClassVar[str] = "fgd"
    learns: ClassVar[bool] = True

    def __init__(
        self,
        options: PolicyOptions | None = None,
        distribution: ShapeDistribution | None = None,
    ) -> None:
        self.options = options or PolicyOptions()
        self._cache = FragScoreCache()
        self._fixed = distribution is not None
        self._weights: dict[ShapeKey, float] = {}
        self._num_models = 0
        self._seen = 0  # arrivals observed
        self._seen_at_build = 0  # arrivals counted in the distribution in use
        if distribution is not None:
            self._cache.set_distribution(distribution)

    def know_trace(self, shapes: Iterable[Shape], num_models: int) -> None:
        self._cache.set_distribution(ShapeDistribution.from_shapes(shapes, num_models))
        self._fixed = True

    def observe(self, shape: Shape) -> None:
        if self._fixed:
            return
        key = shape_key(shape)
        self._weights[key] = self._weights.get(key, 0.0) + 1.0
        if shape.models is not None:
            self._num_models = max(self._num_models, len(shape.models))
        self._seen += 1

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        if not feasible.any():
            return None
        # Without the trace, rebuild from the arrivals whenever they grew by a tenth.
        stale = self._seen > self._seen_at_build * 1.1
        if self._cache.dist is None or (not self._fixed and stale):
            weights = dict(self._weights) or {shape_key(shape): 1.0}
            num_models = max(self._num_models, len(capacity.model_names))
            self._cache.set_distribution(ShapeDistribution.from_weights(weights, num_models))
            self._seen_at_build = self._seen
        self._cache.sync(capacity)
        delta, gpu = self._cache.best(capacity, shape, feasible)
        scores = np.where(feasible, paper_score(delta), -1)
        node = int(np.argmax(scores))
        if not feasible[node]:
            return None
        return shares_choice(capacity, shape, node, int(gpu[node]))


__all__ = [
    "IMPOSSIBLE",
    "FGDPolicy",
    "FragScoreCache",
    "TraceInformed",
    "after_placement",
    "paper_score",
    "shares_choice",
]
