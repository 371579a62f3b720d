"""CPU and host-memory balance: GPU capacity that a node's free CPU or memory cannot serve.

GPU replicas bring CPU and host memory with them. A node whose free CPU is used up by replicas
that need much CPU per GPU (or by CPU-only replicas) keeps free GPUs that nothing can use; on the
Alibaba trace that is where FGD loses most (``docs/benchmarks.md``, Packing). This module measures
that waste so a placement policy can avoid creating it.

Words:

- **ratio** (:class:`ResourceRatio`): the CPU milli (or host memory MiB) that arriving GPU
  replicas ask for per GPU milli, learned online from the replicas seen (decayed by age, with a
  prior before any), so it follows the workload.
- **stranded GPU** of a node (:func:`stranded_gpu`): the free GPU milli beyond what its free CPU
  and memory can serve at those ratios, ``max(0, free_gpu - free_cpu / cpu_ratio, free_gpu -
  free_mem / mem_ratio)``. A node with much CPU per GPU strands nothing; CPU taken from a node that
  has just enough strands GPU milli one for one with the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.placement.base import CapacityArrays, Shape
from gpupool.scheduling.placement.fragmentation import FloatArray

#: Prior ratios before any arrival: 11 CPU cores and 40 GiB of host memory per GPU.
PRIOR_CPU_PER_GPU = 11_000
PRIOR_MIB_PER_GPU = 40_960


@dataclass
class ResourceRatio:
    """Decayed CPU milli and host memory MiB per GPU milli of the GPU replicas observed.

    ``half_life`` is in observed GPU replicas (``None``: no decay); the prior counts as
    ``prior_gpus`` GPUs at :data:`PRIOR_CPU_PER_GPU` and :data:`PRIOR_MIB_PER_GPU`.
    """

    half_life: float | None = 4000.0
    prior_gpus: float = 20.0
    _cpu: float = 0.0
    _mem: float = 0.0
    _gpu: float = 0.0

    def observe(self, shape: Shape) -> None:
        if shape.count == 0:
            return  # CPU-only replicas use CPU, they do not set how much a GPU needs
        if self.half_life is not None:
            keep = 2.0 ** (-1.0 / self.half_life)
            self._cpu *= keep
            self._mem *= keep
            self._gpu *= keep
        self._cpu += shape.cpu_milli
        self._mem += shape.host_memory_mib
        self._gpu += shape.total_milli

    @property
    def cpu_per_milli(self) -> float:
        """CPU milli per GPU milli."""
        prior = self.prior_gpus * MILLI_PER_GPU
        return (self._cpu + prior * PRIOR_CPU_PER_GPU / MILLI_PER_GPU) / (self._gpu + prior)

    @property
    def mem_per_milli(self) -> float:
        """Host memory MiB per GPU milli."""
        prior = self.prior_gpus * MILLI_PER_GPU
        return (self._mem + prior * PRIOR_MIB_PER_GPU / MILLI_PER_GPU) / (self._gpu + prior)


def stranded_gpu(
    free_gpu: FloatArray,
    free_cpu: FloatArray,
    free_mem: FloatArray | None,
    ratio: ResourceRatio,
) -> FloatArray:
    """GPU milli of each node that its free CPU or host memory cannot serve (see module doc).

    ``free_mem`` ``None`` leaves host memory out.
    """
    stranded = free_gpu - free_cpu / ratio.cpu_per_milli
    if free_mem is not None:
        stranded = np.maximum(stranded, free_gpu - free_mem / ratio.mem_per_milli)
    result: FloatArray = np.maximum(stranded, 0.0)
    return result


def stranding_growth(
    capacity: CapacityArrays, shape: Shape, ratio: ResourceRatio, memory: bool = True
) -> FloatArray:
    """[N] how much each node's stranded GPU milli grows if ``shape`` goes there.

    ``memory`` False counts CPU only.
    """
    free_gpu = np.einsum("ij,ij->i", capacity.free_milli, capacity.usable).astype(np.float64)
    cpu = capacity.cpu_free.astype(np.float64)
    mem = capacity.host_mem_free.astype(np.float64) if memory else None
    before = stranded_gpu(free_gpu, cpu, mem, ratio)
    after = stranded_gpu(
        free_gpu - shape.total_milli,
        cpu - shape.cpu_milli,
        None if mem is None else mem - shape.host_memory_mib,
        ratio,
    )
    growth: FloatArray = after - before
    return growth


__all__ = [
    "PRIOR_CPU_PER_GPU",
    "PRIOR_MIB_PER_GPU",
    "ResourceRatio",
    "stranded_gpu",
    "stranding_growth",
]
