"""GPU fragmentation as the FGD paper defines it, vectorised over nodes.

Reference: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023.

Words:

- **shape key**: what fragmentation looks at in a pod, ``(cpu_milli, gpu_milli, gpu_count,
  models)``; ``gpu_milli`` is per GPU (0 for a CPU-only pod) and ``models`` the tuple of accepted
  model flags (``None`` = any model). Memory is not part of it, as in the paper.
- **shape distribution** (:class:`ShapeDistribution`): the most frequent shape keys until they
  cover ``coverage`` (95 %) of the pods counted, with their frequencies renormalised to sum to 1.
  The paper counts the whole trace up front; gpupool's default policy counts only pods it has seen.
- **fragment of node n for shape m**: if m fits on n (model allowed, enough CPU, and at least
  ``count`` GPUs with free milli >= m's milli), the free milli of the GPUs whose free milli is below
  m's milli; otherwise (and always for a CPU-only m) all free GPU milli of n.
- **node fragmentation** ``F(n) = sum_m p_m * fragment(n, m)``; the cluster's is the sum over nodes.

Everything here is a pure function of arrays, so the same code scores live placements, measures
the experiment and serves tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.scheduling.placement.base import CapacityArrays, IntArray, Shape

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: The paper's coverage of the shape distribution: most frequent shapes up to 95 % of pods.
DEFAULT_COVERAGE = 0.95

ShapeKey = tuple[int, int, int, tuple[bool, ...] | None]


def shape_key(shape: Shape) -> ShapeKey:
    """The fragmentation-relevant part of ``shape`` (see the module docstring)."""
    milli = shape.milli if shape.count > 0 else 0
    return (shape.cpu_milli, milli, shape.count, shape.models)


def _sort_key(item: tuple[ShapeKey, float]) -> tuple[float, int, int, int, tuple[int, ...]]:
    # The authors sort by count, then by (cpu, milli, count, model) - all descending.
    (cpu, milli, count, models), weight = item
    flags = tuple(int(m) for m in models) if models is not None else (2,)
    return (weight, cpu, milli, count, flags)


@dataclass(frozen=True)
class ShapeDistribution:
    """The shapes that fragmentation is measured against, as parallel arrays of length M.

    ``allowed[m, k]`` says whether shape m accepts GPU model k (index into
    ``CapacityArrays.model_names``); ``prob`` sums to 1 (or the distribution is empty).
    """

    cpu: IntArray
    milli: IntArray
    count: IntArray
    allowed: BoolArray
    prob: FloatArray
    keys: tuple[ShapeKey, ...] = ()

    def probabilities(self) -> dict[ShapeKey, float]:
        """``prob`` by shape key (to compare two distributions)."""
        return {key: float(p) for key, p in zip(self.keys, self.prob, strict=True)}

    @property
    def size(self) -> int:
        return int(self.prob.shape[0])

    @classmethod
    def from_weights(
        cls,
        weights: Mapping[ShapeKey, float],
        num_models: int,
        coverage: float = DEFAULT_COVERAGE,
    ) -> ShapeDistribution:
        """Top shapes of ``weights`` (count or decayed count per key) covering ``coverage``."""
        items = sorted(((k, w) for k, w in weights.items() if w > 0), key=_sort_key, reverse=True)
        total = sum(w for _, w in items)
        chosen: list[tuple[ShapeKey, float]] = []
        cum = 0.0
        for key, weight in items:
            if cum >= coverage * total:
                break
            chosen.append((key, weight))
            cum += weight
        m = len(chosen)
        allowed = np.ones((m, num_models), dtype=np.bool_)
        for i, ((_, _, _, models), _) in enumerate(chosen):
            if models is not None:
                allowed[i] = np.asarray(models, dtype=np.bool_)[:num_models]
        prob = np.asarray([w for _, w in chosen], dtype=np.float64)
        if m:
            prob = prob / prob.sum()
        return cls(
            cpu=np.asarray([k[0] for k, _ in chosen], dtype=np.int64),
            milli=np.asarray([k[1] for k, _ in chosen], dtype=np.int64),
            count=np.asarray([k[2] for k, _ in chosen], dtype=np.int64),
            allowed=allowed,
            prob=prob,
            keys=tuple(k for k, _ in chosen),
        )

    @classmethod
    def from_shapes(
        cls, shapes: Iterable[Shape], num_models: int, coverage: float = DEFAULT_COVERAGE
    ) -> ShapeDistribution:
        """The paper's distribution: count every shape in ``shapes`` once."""
        weights: dict[ShapeKey, float] = {}
        for shape in shapes:
            key = shape_key(shape)
            weights[key] = weights.get(key, 0.0) + 1.0
        return cls.from_weights(weights, num_models, coverage)


def node_fragmentation(
    free_milli: IntArray,
    usable: BoolArray,
    cpu_free: IntArray,
    node_model: IntArray,
    dist: ShapeDistribution,
) -> FloatArray:
    """``F`` of each row: ``free_milli``/``usable`` are [..., G], ``cpu_free``/``node_model`` [...].

    Leading dimensions are free, so callers can score candidate states ([K, C, G]) in one call.
    """
    free = np.where(usable, free_milli, 0)
    total = free.sum(axis=-1).astype(np.float64)
    if dist.size == 0:
        return np.zeros(total.shape, dtype=np.float64)
    f = free[..., None, :]  # [..., 1, G]
    milli = dist.milli[:, None]  # [M, 1]
    fits_slot = f >= milli  # [..., M, G]
    enough = np.count_nonzero(fits_slot, axis=-1) >= dist.count  # [..., M]
    access = dist.allowed.T[node_model]  # [..., M]
    cpu_ok = cpu_free[..., None] >= dist.cpu  # [..., M]
    satisfied = enough & cpu_ok & access & (dist.milli > 0)
    # Free milli below m's milli: all free milli minus that of the slots where m fits.
    small = total[..., None] - np.einsum("...mg,...g->...m", fits_slot, free, dtype=np.float64)
    frag = np.where(satisfied, small, total[..., None])
    # einsum, not a matrix product: BLAS rounds a row differently with its place in the batch,
    # and integer scores of nearly equal drops would then depend on which rows were scored together.
    result: FloatArray = np.einsum("...m,m->...", frag, dist.prob)
    return result


def capacity_fragmentation(capacity: CapacityArrays, dist: ShapeDistribution) -> FloatArray:
    """``F`` of every node of ``capacity`` (milli-GPU)."""
    return node_fragmentation(
        capacity.free_milli, capacity.usable, capacity.cpu_free, capacity.node_model, dist
    )
