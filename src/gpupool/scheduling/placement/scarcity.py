"""GPU-model pressure: how much of a model's free capacity model-constrained demand will want.

Some replicas accept only some GPU models (``Shape.models``). If replicas that accept any model
fill the models that constrained replicas need, the constrained ones are dropped later while other
models stand empty (the ``gpuspec`` lists of the packing experiment, ``docs/benchmarks.md``). The
rule here keeps such demand in view, learned online from the replicas seen so far.

Words:

- **constrained demand** (:class:`ModelDemand`): per set of accepted models, the GPU milli of the
  arriving replicas that accept only that set, as a fraction of all arriving GPU milli (decayed by
  age, so it follows a changing mix).
- **pressure** of model k (:meth:`ModelDemand.pressure`): if the cluster's free GPU capacity
  were filled by arrivals at that mix, the demand that only some models accept would want
  ``pressure[k]`` times model k's free capacity. Each set's share is spread over its models in
  proportion to their free capacity. ``pressure >= 1``: constrained demand alone would fill it.
- **level** (:meth:`ModelDemand.levels`): pressure cut into ``levels`` steps (0 = no pressure,
  ``levels`` = at or above 1), so replicas with a choice of models go to the lowest level first
  and compete on fragmentation only within a level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpupool.scheduling.placement.base import CapacityArrays, IntArray, Shape
from gpupool.scheduling.placement.fragmentation import FloatArray


@dataclass
class ModelDemand:
    """Decayed GPU milli of arrivals per accepted-model set; ``half_life`` in GPU replicas."""

    half_life: float | None = 4000.0
    _growth: float = 1.0  # weight of an arrival now, relative to the weights stored
    _total: float = 0.0
    _constrained: dict[tuple[bool, ...], float] = field(default_factory=dict)

    def observe(self, shape: Shape) -> None:
        if shape.count == 0:
            return
        if self.half_life is not None:
            self._growth *= 2.0 ** (1.0 / self.half_life)
            if self._growth > 1e100:
                self._constrained = {k: w / self._growth for k, w in self._constrained.items()}
                self._total /= self._growth
                self._growth = 1.0
        weight = shape.total_milli * self._growth
        self._total += weight
        if shape.models is not None:
            self._constrained[shape.models] = self._constrained.get(shape.models, 0.0) + weight

    @property
    def constrained(self) -> bool:
        """True once some observed replica accepted only some models."""
        return bool(self._constrained)

    def pressure(self, capacity: CapacityArrays) -> FloatArray:
        """[models] pressure of every GPU model of ``capacity`` (module doc); zeros if none."""
        k = len(capacity.model_names)
        pressure = np.zeros(k, dtype=np.float64)
        if not self._constrained or self._total <= 0:
            return pressure
        usable = capacity.usable
        free_k = np.bincount(
            capacity.slot_model[usable], weights=capacity.free_milli[usable], minlength=k
        )[:k]
        total_free = float(free_k.sum())
        if total_free <= 0:
            return pressure
        for models, weight in self._constrained.items():
            allowed = np.zeros(k, dtype=np.bool_)
            width = min(k, len(models))
            allowed[:width] = models[:width]
            free_set = float(free_k[allowed].sum())
            if free_set > 0:
                pressure[allowed] += weight / self._total * total_free / free_set
        return pressure

    def levels(self, capacity: CapacityArrays, levels: int) -> IntArray:
        """[models] pressure in ``levels`` steps: ``floor(min(pressure, 1) * levels)``."""
        pressure = np.minimum(self.pressure(capacity), 1.0)
        result: IntArray = np.floor(pressure * levels).astype(np.int64)
        return result


__all__ = ["ModelDemand"]
