"""The NVML backend: real NVIDIA GPUs through nvidia-ml-py (imported as ``pynvml``).

One ``sample()`` reads every device once: utilisation, memory, temperature, power, clocks and
per-process memory, plus any XID events queued since the last call (non-blocking). Every call
goes through :class:`~gpupool.gpu.nvml_calls.Calls`: a reading the device does not support
becomes ``None``; a GPU that fell off the bus (``GPU_IS_LOST``) becomes a sample with
``lost=True``; any other error makes that reading ``None`` for that sample and is listed in
``DeviceSample.failed_calls`` (the health tracker decides what it means). A GPU that cannot be
identified at start (lost, or its UUID or memory unreadable) is left out of the inventory and
named in :attr:`NvmlBackend.problems`; the other GPUs are used. With no driver or library,
opening the backend raises :class:`~gpupool.gpu.base.GpuUnavailable` with one line that says
what to do.

Words and decisions:

- **memory**: the v2 memory info (``used`` without driver-reserved memory, and ``reserved``)
  where the driver has it, else v1 (``used`` includes the reserve). A device that refuses v2
  once is read with v1 from then on.
- **processes**: the compute processes and the MPS compute processes (an MPS client may show
  in either list depending on the driver), one entry per pid.
- **NVLink**: an active link ends at another GPU (its PCI bus id is one of this node's GPUs) or
  at an NVSwitch (remote device type ``SWITCH``, as on HGX/DGX boards): every GPU that reaches
  the same switch is a peer.
- **MIG**: a MIG-enabled GPU's instances are listed in ``DeviceInfo.mig_instances`` and sampled
  as devices of their own (``MIG-...`` UUIDs; NVML gives memory for them but no utilisation). A
  MIG-enabled GPU with no instances has none. The instances are listed again on every sample:
  after an admin re-partitions a GPU the handles and the inventory are refreshed, and
  :meth:`NvmlBackend.inventory` returns the new one (the agent registers it again).

The ``nvml`` argument exists so tests can pass a fake module; production code passes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
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
from gpupool.gpu.nvml_calls import Calls, Lost, describe, log

_PROFILE_RE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)
_NO_DRIVER_HINT = (
    "install the NVIDIA driver, or run with --simulate 4xA100-80GB to use simulated GPUs"
)


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


@dataclasses.dataclass
class _Links:
    """What one GPU's active NVLinks reach: other GPUs' and NVSwitches' PCI bus ids."""

    gpus: list[str] = dataclasses.field(default_factory=list)
    switches: set[str] = dataclasses.field(default_factory=set)


class NvmlBackend:
    """Real GPUs of this node through NVML."""

    name = "nvml"

    def __init__(self, nvml: Any | None = None) -> None:
        self._nv = nvml if nvml is not None else _import_pynvml()
        nv = self._nv
        self.calls = Calls(nv)
        #: GPUs left out at start, and why (one line each).
        self.problems: list[str] = []
        try:
            nv.nvmlInit()
        except OSError as exc:  # library present but unloadable
            raise GpuUnavailable(f"NVML could not be loaded ({exc}): {_NO_DRIVER_HINT}") from None
        except Exception as exc:  # NVMLError, or a binding that does not match the driver
            raise GpuUnavailable(
                f"no NVIDIA driver could be used ({describe(exc)}): {_NO_DRIVER_HINT}"
            ) from None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise GpuUnavailable(f"NVML cannot list the GPUs ({describe(exc)})") from None
        handles: list[tuple[int, Any]] = []
        for index in range(count):
            try:
                handles.append((index, nv.nvmlDeviceGetHandleByIndex(index)))
            except Exception as exc:
                self._problem(f"GPU index {index}: no handle ({describe(exc)})")
        version = self.calls.call("system", nv.nvmlSystemGetDriverVersion)
        #: The driver's version (``570.86.15``), ``unknown`` when NVML does not say.
        self.driver_version = _text(version) if version is not None else "unknown"
        self._inventory, self._handles = self._read_inventory(handles)
        if not self._inventory:
            self._shutdown()
            detail = f" ({'; '.join(self.problems)})" if self.problems else ""
            raise GpuUnavailable(
                f"the NVIDIA driver sees no usable GPU on this machine{detail}: {_NO_DRIVER_HINT}"
            )
        self._mig_handles: dict[str, Any] = {}
        for info, handle in zip(self._inventory, self._handles, strict=True):
            if info.mig_enabled:
                with contextlib.suppress(Lost):  # the first sample reports it lost
                    self._mig_handles.update(self._list_mig(handle, info.uuid)[1])
        self._v1_only: set[str] = set()
        self._event_set = self._register_xid_events()

    def _problem(self, text: str) -> None:
        self.problems.append(text)
        log.warning("%s: this GPU is not used", text)

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()

    # -- inventory

    def _read_inventory(
        self, handles: list[tuple[int, Any]]
    ) -> tuple[tuple[DeviceInfo, ...], list[Any]]:
        nv, calls = self._nv, self.calls
        known: list[tuple[int, Any, str, str | None]] = []  # index, handle, uuid, bus id
        for index, handle in handles:
            where = f"GPU index {index}"
            try:
                uuid = calls.call(where, nv.nvmlDeviceGetUUID, handle)
                mem = calls.call(where, nv.nvmlDeviceGetMemoryInfo, handle)
                pci = calls.call(where, nv.nvmlDeviceGetPciInfo, handle)
            except Lost:
                self._problem(f"{where}: the GPU is lost (fallen off the bus)")
                continue
            if uuid is None or mem is None:
                what = "UUID" if uuid is None else "memory"
                self._problem(f"{where}: NVML cannot read its {what}")
                continue
            bus = _text(pci.busId).upper() if pci is not None else None
            known.append((index, handle, _text(uuid), bus))
        by_bus = {bus: uuid for _, _, uuid, bus in known if bus}
        links: dict[str, _Links] = {}
        devices: list[DeviceInfo] = []
        kept: list[Any] = []
        for index, handle, uuid, bus in known:
            try:
                info, reach = self._read_device(index, handle, uuid, bus)
            except Lost:
                self._problem(f"GPU index {index} ({uuid}): lost while it was read")
                continue
            devices.append(info)
            kept.append(handle)
            links[uuid] = reach
        return _with_peers(devices, links, by_bus), kept

    def _read_device(
        self, index: int, handle: Any, uuid: str, bus: str | None
    ) -> tuple[DeviceInfo, _Links]:
        nv, calls = self._nv, self.calls
        name = calls.call(uuid, nv.nvmlDeviceGetName, handle)
        mem = calls.call(uuid, nv.nvmlDeviceGetMemoryInfo, handle)
        cc = calls.call(uuid, nv.nvmlDeviceGetCudaComputeCapability, handle)
        power = calls.call(uuid, nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        slowdown = calls.call(
            uuid,
            nv.nvmlDeviceGetTemperatureThreshold,
            handle,
            nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        )
        shutdown = calls.call(
            uuid,
            nv.nvmlDeviceGetTemperatureThreshold,
            handle,
            getattr(nv, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0),
        )
        attrs = calls.call(uuid, nv.nvmlDeviceGetAttributes, handle)
        mig_mode = calls.call(uuid, nv.nvmlDeviceGetMigMode, handle)
        mig_enabled = None if mig_mode is None else bool(mig_mode[0])
        minor = calls.call(uuid, nv.nvmlDeviceGetMinorNumber, handle)
        info = DeviceInfo(
            uuid=uuid,
            index=index,
            name=_text(name) if name is not None else "NVIDIA GPU",
            memory_mib=bytes_to_mib(int(mem.total)) if mem is not None else 0,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            pci_bus_id=bus,
            sm_count=int(attrs.multiprocessorCount) if attrs is not None else None,
            power_limit_w=power / 1000.0 if power is not None else None,
            slowdown_temp_c=float(slowdown) if slowdown is not None else None,
            shutdown_temp_c=float(shutdown) if shutdown is not None else None,
            mig_enabled=mig_enabled,
            mig_instances=self._list_mig(handle, uuid)[0] if mig_enabled else (),
            minor_number=int(minor) if minor is not None else None,
        )
        return info, self._read_nvlink(handle, uuid)

    def _list_mig(self, handle: Any, parent: str) -> tuple[tuple[MigInstance, ...], dict[str, Any]]:
        """The MIG instances of one GPU, and their handles (an empty slot is skipped)."""
        nv, calls = self._nv, self.calls
        count = calls.call(parent, nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        instances: list[MigInstance] = []
        found: dict[str, Any] = {}
        for i in range(int(count)):
            mig = calls.call(parent, nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is None:  # an empty slot
                continue
            uuid = calls.call(parent, nv.nvmlDeviceGetUUID, mig)
            mem = calls.call(parent, nv.nvmlDeviceGetMemoryInfo, mig)
            if uuid is None or mem is None:
                continue
            name = _text(calls.call(parent, nv.nvmlDeviceGetName, mig) or "")
            profile = _PROFILE_RE.search(name)
            attrs = calls.call(parent, nv.nvmlDeviceGetAttributes, mig)
            instances.append(
                MigInstance(
                    uuid=_text(uuid),
                    parent_uuid=parent,
                    index=i,
                    profile=profile.group(1).lower() if profile else None,
                    memory_mib=bytes_to_mib(int(mem.total)),
                    gpu_instance_id=calls.call(parent, nv.nvmlDeviceGetGpuInstanceId, mig),
                    compute_instance_id=calls.call(parent, nv.nvmlDeviceGetComputeInstanceId, mig),
                    sm_count=int(attrs.multiprocessorCount) if attrs is not None else None,
                )
            )
            found[_text(uuid)] = mig
        return tuple(instances), found

    def _mig_uuids(self, handle: Any, parent: str) -> list[str]:
        """The UUIDs of one GPU's MIG instances now, in slot order."""
        nv, calls = self._nv, self.calls
        uuids = []
        for i in range(int(calls.call(parent, nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0)):
            mig = calls.call(parent, nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            uuid = calls.call(parent, nv.nvmlDeviceGetUUID, mig) if mig is not None else None
            if uuid is not None:
                uuids.append(_text(uuid))
        return uuids

    def _read_nvlink(self, handle: Any, own: str) -> _Links:
        nv, calls = self._nv, self.calls
        reach = _Links()
        switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        remote_type = getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        invalid = getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", object())
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except Exception as exc:
                if getattr(exc, "value", None) == invalid:
                    break  # past this GPU's last link
                if calls.is_unsupported(exc):
                    if link == 0:
                        break  # no NVLink at all
                    continue
                calls.call(own, nv.nvmlDeviceGetNvLinkState, handle, link)  # log it once
                continue
            if state != nv.NVML_FEATURE_ENABLED:
                continue
            remote = calls.call(own, nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue
            bus = _text(remote.busId).upper()
            kind = calls.call(own, remote_type, handle, link) if remote_type else None
            if kind == switch_type:
                reach.switches.add(bus)
            elif bus not in reach.gpus:
                reach.gpus.append(bus)
        return reach

    def _register_xid_events(self) -> Any:
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except Exception as exc:
            log.info("no XID events from this driver (%s)", describe(exc))
            return None
        for handle in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except Exception:
                continue  # not supported on this device (e.g. some consumer cards)
        return event_set

    @property
    def xid_events_supported(self) -> bool:
        return self._event_set is not None

    # -- GpuBackend

    def inventory(self) -> tuple[DeviceInfo, ...]:
        return self._inventory

    def set_workload(self, workloads: Sequence[Workload]) -> None:
        return None  # the hardware reports what really runs

    def sample(self) -> Telemetry:
        self._refresh_mig()
        samples = [
            self._sample_device(info.uuid, handle, info.memory_mib)
            for info, handle in zip(self._inventory, self._handles, strict=True)
        ]
        sizes = {m.uuid: m.memory_mib for d in self._inventory for m in d.mig_instances}
        for uuid, handle in self._mig_handles.items():
            samples.append(self._sample_device(uuid, handle, sizes[uuid]))
        return Telemetry(tuple(samples), self._drain_xids())

    def _refresh_mig(self) -> None:
        """List each MIG-enabled GPU's instances again; new ones replace the old handles."""
        changed = False
        devices = list(self._inventory)
        for i, (info, handle) in enumerate(zip(self._inventory, self._handles, strict=True)):
            if not info.mig_enabled:
                continue
            try:
                if self._mig_uuids(handle, info.uuid) == [m.uuid for m in info.mig_instances]:
                    continue  # unchanged: the cheap check (a handle and a UUID per slot)
                instances, found = self._list_mig(handle, info.uuid)
            except Lost:
                continue  # the sample reports the GPU lost
            if instances == info.mig_instances:
                continue
            log.info(
                "%s: MIG instances changed to %s",
                info.uuid,
                ", ".join(f"{m.uuid} ({m.profile})" for m in instances) or "none",
            )
            for old in info.mig_instances:
                self._mig_handles.pop(old.uuid, None)
            self._mig_handles.update(found)
            devices[i] = dataclasses.replace(info, mig_instances=instances)
            changed = True
        if changed:
            self._inventory = tuple(devices)

    def _memory(self, uuid: str, handle: Any, failures: list[str]) -> tuple[int, int | None] | None:
        """(used MiB, reserved MiB or ``None``): v2 where it works, else v1."""
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and uuid not in self._v1_only:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(handle, version=version)
            except Exception as exc:
                if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", None):
                    raise Lost from None
                if isinstance(exc, (TypeError, AttributeError)) or self.calls.is_unsupported(exc):
                    # An old binding (no ``version``) or a driver without v2: v1 from now on.
                    self._v1_only.add(uuid)
                    log.info(
                        "%s: no v2 memory info (%s): used memory includes the reserve",
                        uuid,
                        describe(exc),
                    )
            else:
                self.calls.outcomes["nvmlDeviceGetMemoryInfo(v2)"] = "ok"
                return max(0, bytes_to_mib(int(mem.used))), bytes_to_mib(int(mem.reserved))
        mem = self.calls.call(uuid, nv.nvmlDeviceGetMemoryInfo, handle, failures=failures)
        return None if mem is None else (bytes_to_mib(int(mem.used)), None)

    def _processes(self, uuid: str, handle: Any, failures: list[str]) -> tuple[ProcessUsage, ...]:
        nv, calls = self._nv, self.calls
        seen: dict[int, int | None] = {}
        for fn_name in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetMPSComputeRunningProcesses",
        ):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                continue
            for p in calls.call(uuid, fn, handle, failures=failures) or []:
                used = getattr(p, "usedGpuMemory", None)
                mib = bytes_to_mib(int(used)) if used is not None else None
                pid = int(p.pid)
                if seen.get(pid) is None:
                    seen[pid] = mib
        return tuple(ProcessUsage(pid=pid, used_memory_mib=mib) for pid, mib in seen.items())

    def _sample_device(self, uuid: str, handle: Any, total_mib: int) -> DeviceSample:
        nv, calls = self._nv, self.calls
        failures: list[str] = []

        def read(fn: Any, *args: Any) -> Any:
            return calls.call(uuid, fn, handle, *args, failures=failures)

        try:
            util = read(nv.nvmlDeviceGetUtilizationRates)
            memory = self._memory(uuid, handle, failures)
            temp = read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
            power = read(nv.nvmlDeviceGetPowerUsage)
            sm_clock = read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
            mem_clock = read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)
            processes = self._processes(uuid, handle, failures)
        except Lost:
            return DeviceSample(uuid=uuid, memory_total_mib=total_mib, lost=True)
        return DeviceSample(
            uuid=uuid,
            memory_total_mib=total_mib,
            utilization_ratio=util.gpu / 100.0 if util is not None else None,
            memory_used_mib=memory[0] if memory is not None else None,
            memory_reserved_mib=memory[1] if memory is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            memory_clock_mhz=int(mem_clock) if mem_clock is not None else None,
            processes=processes,
            failed_calls=tuple(failures),
        )

    def _drain_xids(self) -> tuple[XidEvent, ...]:
        nv = self._nv
        if self._event_set is None:
            return ()
        events: list[XidEvent] = []
        for _ in range(64):  # a bounded drain: never spin on a storm of events
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:
                break  # NVML_ERROR_TIMEOUT: nothing queued
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
            except Exception:
                uuid = "unknown"
            events.append(XidEvent(uuid, int(data.eventData)))
        return tuple(events)

    def close(self) -> None:
        nv = self._nv
        if self._event_set is not None:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self._shutdown()


def _with_peers(
    devices: list[DeviceInfo], links: dict[str, _Links], by_bus: dict[str, str]
) -> tuple[DeviceInfo, ...]:
    """Each device with its NVLink peers: GPUs linked directly, or through a shared switch."""
    out = []
    for d in devices:
        reach = links[d.uuid]
        peers = [by_bus[b] for b in reach.gpus if b in by_bus and by_bus[b] != d.uuid]
        for other in devices:
            if other.uuid != d.uuid and reach.switches & links[other.uuid].switches:
                peers.append(other.uuid)
        out.append(dataclasses.replace(d, nvlink_peers=tuple(dict.fromkeys(peers))))
    return tuple(out)
