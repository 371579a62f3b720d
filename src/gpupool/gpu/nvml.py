"""The NVML backend: real NVIDIA GPUs through nvidia-ml-py (imported as ``pynvml``).

One ``sample()`` reads every device once: utilisation, memory, temperature, power, clocks and
per-process memory, plus any XID events queued since the last call (non-blocking). A reading the
device does not support (``NVML_ERROR_NOT_SUPPORTED``, ``NO_PERMISSION``, a function missing from
an older driver) becomes ``None``; a GPU that fell off the bus (``GPU_IS_LOST``) becomes a sample
with ``lost=True``. With no driver or library, opening the backend raises
:class:`~gpupool.gpu.base.GpuUnavailable` with one line that says what to do.

MIG: when a GPU has MIG enabled, its instances are listed in ``DeviceInfo.mig_instances`` and
sampled as devices of their own (``MIG-...`` UUIDs; NVML gives memory for them but no
utilisation). NVLink peers are found by matching each active link's remote PCI bus id to the
bus ids of this node's GPUs.

The ``nvml`` argument exists so tests can pass a fake module; production code passes nothing.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from gpupool.domain.units import bytes_to_mib
from gpupool.gpu.base import (
    DeviceInfo,
    DeviceSample,
    GpuUnavailable,
    MigInstance,
    ProcessUsage,
    Telemetry,
    Workload,
    XidEvent,
)

_PROFILE_RE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)
_NO_DRIVER_HINT = (
    "install the NVIDIA driver, or run with --simulate 4xA100-80GB to use simulated GPUs"
)


class _Lost(Exception):
    """The GPU is gone (``NVML_ERROR_GPU_IS_LOST``)."""


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:  # pragma: no cover - it is a dependency
        raise GpuUnavailable(
            f"nvidia-ml-py is not installed (pip install nvidia-ml-py), or {_NO_DRIVER_HINT}"
        ) from None
    return pynvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Real GPUs of this node through NVML."""

    name = "nvml"

    def __init__(self, nvml: Any | None = None) -> None:
        self._nv = nvml if nvml is not None else _import_pynvml()
        self._unsupported = {
            getattr(self._nv, n)
            for n in (
                "NVML_ERROR_NOT_SUPPORTED",
                "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND",
                "NVML_ERROR_NOT_FOUND",
            )
            if hasattr(self._nv, n)
        }
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            raise GpuUnavailable(
                f"no NVIDIA driver could be used ({_text(exc)}): {_NO_DRIVER_HINT}"
            ) from None
        except OSError as exc:  # library present but unloadable
            raise GpuUnavailable(f"NVML could not be loaded ({exc}): {_NO_DRIVER_HINT}") from None
        try:
            count = int(self._nv.nvmlDeviceGetCount())
            self._handles = [self._nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._nv.NVMLError as exc:
            self._nv.nvmlShutdown()
            raise GpuUnavailable(f"NVML cannot list the GPUs ({_text(exc)})") from None
        if not self._handles:
            self._nv.nvmlShutdown()
            raise GpuUnavailable(
                f"the NVIDIA driver sees no GPU on this machine: {_NO_DRIVER_HINT}"
            )
        self._inventory = self._read_inventory()
        self._uuids = [d.uuid for d in self._inventory]
        self._mig_handles: dict[str, Any] = {}
        for info, handle in zip(self._inventory, self._handles, strict=True):
            for mig in info.mig_instances:
                mig_handle = self._opt(
                    self._nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, mig.index
                )
                if mig_handle is not None:
                    self._mig_handles[mig.uuid] = mig_handle
        self._event_set = self._register_xid_events()

    # -- helpers

    def _opt(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or ``None`` when the device does not support it; raises ``_Lost``."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == getattr(self._nv, "NVML_ERROR_GPU_IS_LOST", object()):
                raise _Lost from None
            if code in self._unsupported:
                return None
            raise

    # -- inventory

    def _read_inventory(self) -> tuple[DeviceInfo, ...]:
        nv = self._nv
        bus_ids: list[str | None] = []
        for handle in self._handles:
            pci = self._opt(nv.nvmlDeviceGetPciInfo, handle)
            bus_ids.append(_text(pci.busId).upper() if pci is not None else None)
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in self._handles]
        by_bus = {bus: uuid for bus, uuid in zip(bus_ids, uuids, strict=True) if bus}
        devices = []
        for index, handle in enumerate(self._handles):
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            cc = self._opt(nv.nvmlDeviceGetCudaComputeCapability, handle)
            power = self._opt(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
            slowdown = self._opt(
                nv.nvmlDeviceGetTemperatureThreshold,
                handle,
                nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            )
            attrs = self._opt(nv.nvmlDeviceGetAttributes, handle)
            mig_mode = self._opt(nv.nvmlDeviceGetMigMode, handle)
            mig_enabled = None if mig_mode is None else bool(mig_mode[0])
            devices.append(
                DeviceInfo(
                    uuid=uuids[index],
                    index=index,
                    name=_text(nv.nvmlDeviceGetName(handle)),
                    memory_mib=bytes_to_mib(int(mem.total)),
                    compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
                    pci_bus_id=bus_ids[index],
                    sm_count=int(attrs.multiprocessorCount) if attrs is not None else None,
                    power_limit_w=power / 1000.0 if power is not None else None,
                    slowdown_temp_c=float(slowdown) if slowdown is not None else None,
                    mig_enabled=mig_enabled,
                    mig_instances=self._read_mig(handle, uuids[index]) if mig_enabled else (),
                    nvlink_peers=self._read_nvlink(handle, by_bus, uuids[index]),
                )
            )
        return tuple(devices)

    def _read_mig(self, handle: Any, parent: str) -> tuple[MigInstance, ...]:
        nv = self._nv
        count = self._opt(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        instances = []
        for i in range(int(count)):
            mig = self._opt(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is None:  # an empty slot
                continue
            name = _text(self._opt(nv.nvmlDeviceGetName, mig) or "")
            profile = _PROFILE_RE.search(name)
            attrs = self._opt(nv.nvmlDeviceGetAttributes, mig)
            instances.append(
                MigInstance(
                    uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                    parent_uuid=parent,
                    index=i,
                    profile=profile.group(1).lower() if profile else None,
                    memory_mib=bytes_to_mib(int(nv.nvmlDeviceGetMemoryInfo(mig).total)),
                    gpu_instance_id=self._opt(nv.nvmlDeviceGetGpuInstanceId, mig),
                    compute_instance_id=self._opt(nv.nvmlDeviceGetComputeInstanceId, mig),
                    sm_count=int(attrs.multiprocessorCount) if attrs is not None else None,
                )
            )
        return tuple(instances)

    def _read_nvlink(self, handle: Any, by_bus: dict[str, str], own: str) -> tuple[str, ...]:
        nv = self._nv
        peers: list[str] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._opt(nv.nvmlDeviceGetNvLinkState, handle, link)
            except nv.NVMLError:  # invalid link index on this GPU: no more links
                break
            if state is None:
                if link == 0:
                    break  # no NVLink at all
                continue
            if state != nv.NVML_FEATURE_ENABLED:
                continue
            remote = self._opt(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue
            peer = by_bus.get(_text(remote.busId).upper())
            if peer is not None and peer != own and peer not in peers:
                peers.append(peer)
        return tuple(peers)

    def _register_xid_events(self) -> Any:
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        for handle in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError:
                continue  # not supported on this device (e.g. some consumer cards)
        return event_set

    # -- GpuBackend

    def inventory(self) -> tuple[DeviceInfo, ...]:
        return self._inventory

    def set_workload(self, workloads: Sequence[Workload]) -> None:
        return None  # the hardware reports what really runs

    def sample(self) -> Telemetry:
        samples = [
            self._sample_device(uuid, handle, info.memory_mib)
            for uuid, handle, info in zip(self._uuids, self._handles, self._inventory, strict=True)
        ]
        for uuid, handle in self._mig_handles.items():
            total = next(
                m.memory_mib for d in self._inventory for m in d.mig_instances if m.uuid == uuid
            )
            samples.append(self._sample_device(uuid, handle, total))
        return Telemetry(tuple(samples), self._drain_xids())

    def _sample_device(self, uuid: str, handle: Any, total_mib: int) -> DeviceSample:
        nv = self._nv
        try:
            util = self._opt(nv.nvmlDeviceGetUtilizationRates, handle)
            mem = self._opt(nv.nvmlDeviceGetMemoryInfo, handle)
            temp = self._opt(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            power = self._opt(nv.nvmlDeviceGetPowerUsage, handle)
            sm_clock = self._opt(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
            mem_clock = self._opt(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM)
            procs = self._opt(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        except _Lost:
            return DeviceSample(uuid=uuid, memory_total_mib=total_mib, lost=True)
        processes = tuple(
            ProcessUsage(
                pid=int(p.pid),
                used_memory_mib=(
                    bytes_to_mib(int(p.usedGpuMemory)) if p.usedGpuMemory is not None else None
                ),
            )
            for p in procs
        )
        return DeviceSample(
            uuid=uuid,
            memory_total_mib=total_mib,
            utilization_ratio=util.gpu / 100.0 if util is not None else None,
            memory_used_mib=bytes_to_mib(int(mem.used)) if mem is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            memory_clock_mhz=int(mem_clock) if mem_clock is not None else None,
            processes=processes,
        )

    def _drain_xids(self) -> tuple[XidEvent, ...]:
        nv = self._nv
        if self._event_set is None:
            return ()
        events: list[XidEvent] = []
        for _ in range(64):  # a bounded drain: never spin on a storm of events
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing queued
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                uuid = "unknown"
            events.append(XidEvent(uuid, int(data.eventData)))
        return tuple(events)

    def close(self) -> None:
        nv = self._nv
        if self._event_set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
