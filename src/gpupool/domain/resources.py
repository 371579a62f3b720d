"""What one replica of a job asks for.

Words:

- ``gpu_milli`` is the whole request in milli-GPU: ``500`` is half of one device, ``2000`` is two
  whole devices. A request above 1000 is always a multiple of 1000 (see ``units``).
- ``gpu_memory_mib`` is GPU memory **per device**, in MiB. ``None`` means "the share of the
  device's memory that matches the compute share" (all of it for whole devices, half of it for
  ``0.5``); the scheduler resolves it against the device it picks.
- ``gpu_types`` lists acceptable GPU models (``A100``, ``H100-80GB``); empty means any.
- ``cpu_milli`` is host CPU in milli-CPU. A job file without ``cpus`` (``cpu_auto``) gets the
  **default CPU rule**, here and nowhere else: its GPU share of the CPUs its pool's nodes have
  per GPU (:func:`default_cpu_milli`), so a 2-core workstation with four GPUs runs sixteen
  quarter-GPU jobs, not two. The CPUs per GPU of a pool are those of its tightest node
  (:func:`cpu_per_gpu_by_pool`), so the default fits on every node of the pool; a pool with
  no GPU node yet counts :data:`FALLBACK_CPU_PER_GPU_MILLI`. A job without a GPU gets one CPU.
  The scheduler's snapshot applies the rule (``gpupool.control.machinery.snapshot``), so it follows
  the pool as nodes join and leave.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.domain.units import MILLI_PER_GPU, validate_gpu_milli

#: CPU of a job without ``cpus`` and without a GPU (milli-CPU), as before the rule.
CPU_ONLY_DEFAULT_MILLI = 1000
#: Milli-CPU per GPU for the rule where a pool has no node with GPUs yet.
FALLBACK_CPU_PER_GPU_MILLI = 1000
#: The least CPU the rule gives a GPU job (milli-CPU).
MIN_DEFAULT_CPU_MILLI = 10


@dataclass(frozen=True)
class ResourceRequest:
    """Resources of one replica. All amounts are integers in gpupool's units."""

    gpu_milli: int = 0
    gpu_memory_mib: int | None = None
    gpu_types: tuple[str, ...] = ()
    cpu_milli: int = 1000
    host_memory_mib: int = 0
    #: True when the job file named no ``cpus``: ``cpu_milli`` is then replaced by the
    #: default CPU rule (:func:`default_cpu_milli`) where the job is scheduled.
    cpu_auto: bool = False

    def __post_init__(self) -> None:
        validate_gpu_milli(self.gpu_milli)
        if self.gpu_memory_mib is not None and self.gpu_memory_mib < 0:
            raise ValueError("gpu_memory_mib must be >= 0")
        if self.cpu_milli < 0 or self.host_memory_mib < 0:
            raise ValueError("cpu_milli and host_memory_mib must be >= 0")

    @property
    def device_count(self) -> int:
        """Number of devices this replica touches: 0 (CPU only), 1 (a fraction or one), or N."""
        if self.gpu_milli == 0:
            return 0
        if self.gpu_milli < MILLI_PER_GPU:
            return 1
        return self.gpu_milli // MILLI_PER_GPU

    @property
    def milli_per_device(self) -> int:
        """Compute share taken on each device: the fraction, or 1000 for whole devices."""
        return min(self.gpu_milli, MILLI_PER_GPU)

    @property
    def is_fractional(self) -> bool:
        """True when the replica shares one device with others (0 < milli < 1000)."""
        return 0 < self.gpu_milli < MILLI_PER_GPU

    def memory_on(self, device_memory_mib: int) -> int:
        """GPU memory this replica takes on a device of ``device_memory_mib`` MiB.

        An explicit request wins; otherwise the share of the device that matches the compute share.
        """
        if self.gpu_memory_mib is not None:
            return self.gpu_memory_mib
        return device_memory_mib * self.milli_per_device // MILLI_PER_GPU


def default_cpu_milli(gpu_milli: int, cpu_per_gpu_milli: int | None) -> int:
    """The CPU of a replica whose job names none: its GPU share of the CPUs per GPU.

    ``gpu_milli`` is the replica's GPU request, ``cpu_per_gpu_milli`` the pool's milli-CPU per
    GPU (``None``: no node with GPUs yet, :data:`FALLBACK_CPU_PER_GPU_MILLI`). A CPU-only job
    gets :data:`CPU_ONLY_DEFAULT_MILLI`.
    """
    if gpu_milli == 0:
        return CPU_ONLY_DEFAULT_MILLI
    per_gpu = FALLBACK_CPU_PER_GPU_MILLI if cpu_per_gpu_milli is None else cpu_per_gpu_milli
    return max(MIN_DEFAULT_CPU_MILLI, gpu_milli * per_gpu // MILLI_PER_GPU)


def cpu_per_gpu_by_pool(
    node_cpu_milli: dict[str, int], device_pools: Iterable[tuple[str, str]]
) -> dict[str, int]:
    """Each pool's milli-CPU per GPU: the smallest ``node CPUs / node GPUs`` of its nodes.

    ``node_cpu_milli`` maps node -> its CPU; ``device_pools`` has one ``(node, pool)`` per
    device. A node's GPUs are all its devices, whatever their pools.
    """
    gpus: dict[str, int] = {}
    pools: dict[str, set[str]] = {}
    for node, pool in device_pools:
        gpus[node] = gpus.get(node, 0) + 1
        pools.setdefault(pool, set()).add(node)
    return {
        pool: min(node_cpu_milli.get(n, 0) // gpus[n] for n in nodes)
        for pool, nodes in pools.items()
    }


def with_default_cpu(request: ResourceRequest, cpu_per_gpu_milli: int | None) -> ResourceRequest:
    """``request`` with the default CPU rule applied when it names no CPU (else unchanged)."""
    if not request.cpu_auto:
        return request
    cpu = default_cpu_milli(request.gpu_milli, cpu_per_gpu_milli)
    return ResourceRequest(
        gpu_milli=request.gpu_milli,
        gpu_memory_mib=request.gpu_memory_mib,
        gpu_types=request.gpu_types,
        cpu_milli=cpu,
        host_memory_mib=request.host_memory_mib,
        cpu_auto=True,
    )
