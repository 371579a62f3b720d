"""What one replica of a job asks for.

Words:

- ``gpu_milli`` is the whole request in milli-GPU: ``500`` is half of one device, ``2000`` is two
  whole devices. A request above 1000 is always a multiple of 1000 (see ``units``).
- ``gpu_memory_mib`` is GPU memory **per device**, in MiB. ``None`` means "the share of the
  device's memory that matches the compute share" (all of it for whole devices, half of it for
  ``0.5``); the scheduler resolves it against the device it picks.
- ``gpu_types`` lists acceptable GPU models (``A100``, ``H100-80GB``); empty means any.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.units import MILLI_PER_GPU, validate_gpu_milli


@dataclass(frozen=True)
class ResourceRequest:
    """Resources of one replica. All amounts are integers in gpupool's units."""

    gpu_milli: int = 0
    gpu_memory_mib: int | None = None
    gpu_types: tuple[str, ...] = ()
    cpu_milli: int = 1000
    host_memory_mib: int = 0

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
