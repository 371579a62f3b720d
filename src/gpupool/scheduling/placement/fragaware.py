"""``fragaware``: gpupool's fragmentation-aware placement, learning the workload online.

It scores placements like FGD (:mod:`.fgd`): the integer ``int(sigmoid(dF / 1000) * 100)`` of
how much the node's fragmentation drops. It differs in what a live scheduler can and cannot know:

- **online shape distribution.** FGD as published counts every pod of the trace before the first
  placement. ``fragaware`` counts only the shapes it has been shown with :meth:`observe`, each
  weighted by ``2 ** (-age / half_life)`` (age in arrivals), so the distribution follows a
  changing mix. Before the first arrival a **prior** (whole GPUs, common shares, a multi-GPU
  job) stands in; its pseudo-counts are outweighed as arrivals accumulate. The distribution is
  rebuilt after as many arrivals as had been seen at the last rebuild (16, 32, 64, ...; at most
  every ``refresh_every``) and swapped in only when one shape's probability moved by more than
  ``tolerance``, so cached scores survive while the mix is stable.
- **tie-breaking.** Many nodes share the top integer score. FGD takes the first in node order;
  ``fragaware`` takes the node with the least GPU milli left after the placement (best fit),
  then the node order.
- **GPU choice for a share.** Among GPUs of equal integer score, the one with the least free
  milli (best fit), then the larger exact drop.
- **CPU and memory balance** (:mod:`.balance`). FGD sees CPU only where it makes a shape stop
  fitting, so it happily spends the CPU of a node whose GPUs will need it. ``fragaware`` subtracts
  from the fragmentation drop how much the placement grows the node's *stranded* GPU milli (free
  GPU that the node's free CPU or host memory cannot serve at the CPU and memory per GPU of the
  arrivals so far), weighted by ``cpu_weight``; CPU-only and CPU-hungry replicas then go to
  CPU-rich nodes, and replicas that need little CPU per GPU to CPU-poor ones.
- **GPU-model pressure** (:mod:`.scarcity`). A replica that may use several GPU models goes first
  to the models whose free capacity model-constrained arrivals want least (pressure level, in
  ``pressure_levels`` steps), then by score, so replicas that can only use a scarce model still
  find it. With no constrained arrivals every level is 0 and this rule does nothing.

The packing experiment (``docs/benchmarks.md``, Packing) measures it against FGD: the balance rule
is what beats FGD on every pod list (unbalanced CPU strands whole GPUs), the pressure rule what
keeps the ``gpuspec`` lists from collapsing, and the online distribution costs little once those
two are in.

Words: **arrival** = one call of :meth:`observe`; **pseudo-count** = the prior's weight in
arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.placement.balance import ResourceRatio, stranding_growth
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    PolicyOptions,
    Shape,
)
from gpupool.scheduling.placement.fgd import FragScoreCache, paper_score, shares_choice
from gpupool.scheduling.placement.fragmentation import (
    FloatArray,
    ShapeDistribution,
    ShapeKey,
    shape_key,
)
from gpupool.scheduling.placement.scarcity import ModelDemand

#: Shapes assumed before any arrival: (cpu milli, GPU milli per GPU, GPU count, any model).
PRIOR_SHAPES: tuple[ShapeKey, ...] = (
    (8000, 1000, 1, None),
    (4000, 500, 1, None),
    (4000, 250, 1, None),
    (16000, 1000, 2, None),
    (32000, 1000, 8, None),
)


@dataclass(frozen=True)
class FragAwareConfig:
    """Knobs of :class:`FragAwarePolicy`; the defaults are the best the packing experiment found.

    ``half_life`` is in arrivals (``None``: every arrival counts the same); ``prior_weight`` is
    the prior's total pseudo-count; the distribution is rebuilt at most every ``refresh_every``
    arrivals and swapped in when a shape's probability moved by more than ``tolerance``; ``tie``
    names the tie-break among equal integer scores (:data:`TIE_BREAKS`); ``tight_gpu`` sends a
    share to the fullest GPU among equals; ``levels`` is the integer score's top (FGD: 100).
    ``cpu_weight`` weighs the growth of stranded GPU milli against the fragmentation drop (0 turns
    the balance rule off) and ``balance_memory`` counts host memory as well as CPU;
    ``pressure_levels`` is the number of GPU-model pressure steps (0 turns the rule off) and
    ``pressure_multi`` applies it to replicas that accept several (not all) models too.
    """

    half_life: float | None = 4000.0
    prior_weight: float = 200.0
    refresh_every: int = 1024
    tolerance: float = 0.02
    tie: str = "bestfit"
    tight_gpu: bool = True
    levels: float = 100.0
    cpu_weight: float = 1.0
    balance_memory: bool = True
    pressure_levels: int = 4
    pressure_multi: bool = True


def _tie_used(capacity: CapacityArrays, shape: Shape, delta: FloatArray) -> FloatArray:
    """Allocated GPU milli of the node, then allocated CPU (both before this placement)."""
    free = np.einsum("ij,ij->i", capacity.free_milli, capacity.usable)  # masked row sum
    used_gpu = capacity.gpu_count * MILLI_PER_GPU - free
    used_cpu = np.maximum(capacity.cpu_total - capacity.cpu_free, 0)
    key: FloatArray = used_gpu * 1e3 + np.minimum(used_cpu, 999_999) / 1e3
    return key


def _tie_bestfit(capacity: CapacityArrays, shape: Shape, delta: FloatArray) -> FloatArray:
    """Least GPU milli left on the node after the placement."""
    free = np.einsum("ij,ij->i", capacity.free_milli, capacity.usable)  # masked row sum
    key: FloatArray = (16 * MILLI_PER_GPU - (free - shape.total_milli)).astype(np.float64)
    return key


def _tie_balanced(capacity: CapacityArrays, shape: Shape, delta: FloatArray) -> FloatArray:
    """Least GPU and CPU left, each over the largest node spec (the paper's BestFit measure)."""
    free = np.einsum("ij,ij->i", capacity.free_milli, capacity.usable)  # masked row sum
    left = (free - shape.total_milli) / 8000.0 + (capacity.cpu_free - shape.cpu_milli) / 128_000.0
    key: FloatArray = (4.0 - left) * 1e7
    return key


def _tie_exact(capacity: CapacityArrays, shape: Shape, delta: FloatArray) -> FloatArray:
    """The exact fragmentation drop."""
    key: FloatArray = np.clip(delta, -1e6, 1e6) + 1e6
    return key


def _tie_row(capacity: CapacityArrays, shape: Shape, delta: FloatArray) -> FloatArray:
    """Nothing: the node order decides."""
    return np.zeros(capacity.num_nodes, dtype=np.float64)


#: Tie-breaks by name; each maps nodes to a key in [0, 1e8), higher wins.
TIE_BREAKS = {
    "balanced": _tie_balanced,
    "bestfit": _tie_bestfit,
    "exact": _tie_exact,
    "row": _tie_row,
    "used": _tie_used,
}


class FragAwarePolicy:
    """FGD scoring, online and recency-weighted, CPU-balanced, GPU-model aware, best-fit ties."""

    name: ClassVar[str] = "fragaware"
    learns: ClassVar[bool] = True

    def __init__(
        self, options: PolicyOptions | None = None, config: FragAwareConfig | None = None
    ) -> None:
        self.options = options or PolicyOptions()
        self.config = config or FragAwareConfig()
        if self.config.tie not in TIE_BREAKS:
            names = ", ".join(sorted(TIE_BREAKS))
            raise ValueError(f"tie-break {self.config.tie!r} is not known: use one of {names}")
        self._cache = FragScoreCache()
        self._weights: dict[ShapeKey, float] = {}
        self._growth = 1.0  # weight of an arrival now, relative to the weights stored
        self._arrivals = 0
        self._since_refresh = 0
        self._num_models = 0
        self._current: dict[ShapeKey, float] = {}
        prior = self.config.prior_weight / len(PRIOR_SHAPES)
        self._prior = dict.fromkeys(PRIOR_SHAPES, prior)
        self._ratio = ResourceRatio(half_life=self.config.half_life)
        self._demand = ModelDemand(half_life=self.config.half_life)

    @property
    def distribution(self) -> ShapeDistribution | None:
        """The shape distribution in use (``None`` before the first placement)."""
        return self._cache.dist

    # -- learning -------------------------------------------------------------------------

    def observe(self, shape: Shape) -> None:
        key = shape_key(shape)
        if self.config.half_life is not None:
            self._growth *= 2.0 ** (1.0 / self.config.half_life)
            if self._growth > 1e100:
                self._weights = {k: w / self._growth for k, w in self._weights.items()}
                self._growth = 1.0
        self._weights[key] = self._weights.get(key, 0.0) + self._growth
        if shape.models is not None:
            self._num_models = max(self._num_models, len(shape.models))
        self._ratio.observe(shape)
        self._demand.observe(shape)
        self._arrivals += 1
        self._since_refresh += 1

    def _learned(self) -> dict[ShapeKey, float]:
        """Decayed weights of the arrivals plus the prior, in arrival units."""
        weights = {k: w / self._growth for k, w in self._weights.items()}
        for key, pseudo in self._prior.items():
            weights[key] = weights.get(key, 0.0) + pseudo
        return weights

    def _refresh(self, capacity: CapacityArrays) -> None:
        # Rebuild after as many arrivals as were seen before (16, 32, 64, ...), at most every
        # ``refresh_every``: quick to learn at first, then stable, still following a new mix.
        period = min(max(self._arrivals - self._since_refresh, 16), self.config.refresh_every)
        due = self._cache.dist is None or self._since_refresh >= period
        if not due:
            return
        self._since_refresh = 0
        num_models = max(self._num_models, len(capacity.model_names))
        dist = ShapeDistribution.from_weights(self._learned(), num_models)
        probs = dist.probabilities()
        if (
            self._cache.dist is not None
            and _max_change(self._current, probs) <= self.config.tolerance
        ):
            return
        self._current = probs
        self._cache.set_distribution(dist)

    # -- placing ----------------------------------------------------------------------------

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        if not feasible.any():
            return None
        self._refresh(capacity)
        self._cache.sync(capacity)
        delta, gpu = self._cache.best(capacity, shape, feasible, tight=self.config.tight_gpu)
        if self.config.cpu_weight:
            delta = delta - self.config.cpu_weight * stranding_growth(
                capacity, shape, self._ratio, memory=self.config.balance_memory
            )
        tie = np.clip(TIE_BREAKS[self.config.tie](capacity, shape, delta), 0.0, 9.99e8)
        key = paper_score(delta, self.config.levels) * 1e9 + tie
        if self._has_choice_of_models(shape) and self._demand.constrained:
            # Leave the GPU models that model-constrained replicas will want to them.
            level = self._demand.levels(capacity, self.config.pressure_levels)
            key = key + (self.config.pressure_levels - level[capacity.node_model]) * 1e12
        key = np.where(feasible, key, -np.inf)
        node = int(np.argmax(key))
        if not feasible[node]:
            return None
        return shares_choice(capacity, shape, node, int(gpu[node]))

    def _has_choice_of_models(self, shape: Shape) -> bool:
        if shape.count == 0 or self.config.pressure_levels <= 0:
            return False
        if shape.models is None:
            return True
        return self.config.pressure_multi and sum(shape.models) > 1


def _max_change(old: dict[ShapeKey, float], new: dict[ShapeKey, float]) -> float:
    keys = set(old) | set(new)
    return max((abs(old.get(k, 0.0) - new.get(k, 0.0)) for k in keys), default=0.0)
