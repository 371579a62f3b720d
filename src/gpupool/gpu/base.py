"""The GPU backend contract: what a node's GPUs are, and what they are doing.

A backend answers two questions, each in one batched read:

- :meth:`GpuBackend.inventory` -- the devices (``DeviceInfo``): identity and fixed properties.
- :meth:`GpuBackend.sample` -- one ``Telemetry`` snapshot: a ``DeviceSample`` per device and the
  XID events seen since the last sample.

Everything returned is frozen: a snapshot never changes after it was taken and never reads a
live value later. ``None`` always means "the hardware or driver does not report this" (NVML's
``NotSupported``), never zero.

Words:

- **device**: one physical GPU, addressed by its UUID (``GPU-...``); a **MIG instance** is a
  partition of one, addressed by its own UUID (``MIG-...``).
- **workload**: what the agent tells the backend is placed on its devices (:class:`Workload`).
  The NVML backend ignores it (the hardware knows); the simulated backend derives its telemetry
  from it.
- **XID**: an NVIDIA driver error code; some are fatal for the device (see ``gpu.health``).

Units: memory in MiB, utilisation as a ratio in [0, 1], temperature in degrees Celsius, power
in watts, clocks in MHz.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpupool.domain.errors import GpupoolError


class GpuUnavailable(GpupoolError):
    """No GPU backend can be opened (no driver, no library). The message is one clear line."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG instance of a physical GPU. ``profile`` is like ``1g.10gb``."""

    uuid: str
    parent_uuid: str
    index: int
    profile: str | None
    memory_mib: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_count: int | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """Fixed facts about one physical GPU.

    ``compute_capability`` is ``(major, minor)``; ``pci_bus_id`` is NVML's bus id
    (``00000000:3B:00.0``); ``sm_count`` is the number of streaming multiprocessors;
    ``power_limit_w`` is the enforced board power limit (TDP unless an admin changed it);
    ``slowdown_temp_c`` is where the GPU starts to throttle, ``shutdown_temp_c`` where the driver
    shuts it down (``None``: not reported). ``mig_enabled`` is ``None`` when the GPU has no MIG
    support; a MIG-enabled GPU with no instances has ``mig_instances == ()`` and nothing of it is
    placeable. ``nvlink_peers`` lists the UUIDs of GPUs on this node reached over an active
    NVLink, directly or through an NVSwitch. ``minor_number`` is the driver's minor number, the
    ``N`` of the GPU's device node ``/dev/nvidiaN``; NVML's index orders GPUs by PCI bus and
    need not equal it (``None``: not reported, as for simulated GPUs: the index stands in).
    ``context_reserve_mib`` is what a simulated GPU says one process holds beyond its slice (its
    spec's ``context_reserve``); a real GPU's is measured by the agent (:mod:`gpupool.gpu.context`)
    and this stays ``None``.
    """

    uuid: str
    index: int
    name: str
    memory_mib: int
    compute_capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None
    sm_count: int | None = None
    power_limit_w: float | None = None
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[str, ...] = ()
    minor_number: int | None = None
    context_reserve_mib: int | None = None

    @property
    def device_node_minor(self) -> int:
        """The ``N`` of ``/dev/nvidiaN`` for this GPU (the index where no minor is known)."""
        return self.minor_number if self.minor_number is not None else self.index


@dataclass(frozen=True)
class ProcessUsage:
    """GPU memory held by one process on one device; ``used_memory_mib`` ``None`` = unknown."""

    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True)
class DeviceSample:
    """What one device was doing at one sample.

    ``lost`` is True when the driver reports the GPU gone (fallen off the bus); every other
    reading is then ``None``. ``memory_used_mib`` excludes driver-reserved memory where the
    driver reports it (NVML's v2 memory info; ``memory_reserved_mib`` is then that reserve,
    ``None`` with v1). ``failed_calls`` names the NVML calls that failed this sample with an
    error other than "not supported" (their readings are ``None``), as ``call: error``.
    """

    uuid: str
    memory_total_mib: int
    utilization_ratio: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    processes: tuple[ProcessUsage, ...] = ()
    lost: bool = False
    memory_reserved_mib: int | None = None
    failed_calls: tuple[str, ...] = ()

    @property
    def memory_usable_mib(self) -> int:
        """What jobs can use: the total less driver-reserved memory."""
        return self.memory_total_mib - (self.memory_reserved_mib or 0)


@dataclass(frozen=True)
class XidEvent:
    """One XID error the driver reported on ``uuid``."""

    uuid: str
    xid: int


@dataclass(frozen=True)
class Telemetry:
    """One batched read of every device, and the XID events since the previous read."""

    devices: tuple[DeviceSample, ...]
    xid_events: tuple[XidEvent, ...] = ()

    def by_uuid(self) -> dict[str, DeviceSample]:
        return {d.uuid: d for d in self.devices}


@dataclass(frozen=True)
class SyntheticLoad:
    """A load a job declares for the simulated backend: utilisation ratio and memory it uses.

    ``None`` fields fall back to the backend's default for the job's share.
    """

    utilization_ratio: float | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class Workload:
    """One job replica placed on devices of this node, as the agent tells the backend.

    ``milli`` and ``memory_mib`` are the slice per device; ``pids`` the job's processes (so a
    simulated device can report per-process memory); ``load`` what the job declared, if anything.
    """

    job_id: str
    device_uuids: tuple[str, ...]
    milli: int
    memory_mib: int
    pids: tuple[int, ...] = ()
    load: SyntheticLoad | None = None


@runtime_checkable
class GpuBackend(Protocol):
    """Where the agent gets its hardware facts. Implementations: ``nvml``, ``simulated``."""

    name: str

    def inventory(self) -> tuple[DeviceInfo, ...]:
        """Every physical device of this node, in index order."""
        ...

    def sample(self) -> Telemetry:
        """One batched, immutable read of every device."""
        ...

    def set_workload(self, workloads: Sequence[Workload]) -> None:
        """What runs on the devices now (used by simulated backends; NVML ignores it)."""
        ...

    def close(self) -> None:
        """Release the driver or library."""
        ...
