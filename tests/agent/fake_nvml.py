"""A stand-in for the ``pynvml`` module, so the NVML backend is tested without a GPU.

The default board is two A100s joined by a direct NVLink, the second with MIG enabled and one
3g.40gb instance. Tests change the board through the attributes (``gpus``, ``migs``,
``not_supported``, ``events``) or, for a separate agent process, through a JSON state file
(:meth:`FakeNvml.from_file`, re-read whenever it changes; :func:`write_state` writes one).

What it models, besides the plain readings:

- **NVSwitch boards**: ``FakeGpu.switch_links`` maps a link to an NVSwitch's PCI bus id; the
  remote device type of such a link is ``NVML_NVLINK_DEVICE_TYPE_SWITCH``.
- **failures**: ``not_supported`` (call names, every device) and ``FakeGpu.fail`` (call name ->
  ``"unknown"``, ``"lost"``, ``"not_supported"`` or ``"mismatch"``, the last being the
  ``NVMLLibraryMismatchError`` that is *not* an ``NVMLError``); ``"*"`` fails every call on it.
- **MPS**: ``FakeGpu.mps_procs`` is what ``nvmlDeviceGetMPSComputeRunningProcesses`` lists.
- **v2 memory**: ``FakeGpu.reserved`` is driver-reserved memory; v1 ``used`` includes it, v2
  ``used`` does not. ``v2_memory = False`` makes the v2 call fail as on old drivers.
- **MIG**: ``migs`` are the instances (parent index, slot); a MIG-enabled GPU may have none.
  ``mig_generation`` bumps on reconfiguration: handles from an older one are stale.
- **temperature**: ``FakeGpu.temp``, ``slowdown`` and ``shutdown`` thresholds.
- **lingering processes**: processes stay listed until a test removes them (NVML lists a killed
  process until the driver has torn its context down).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 6
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
nvmlEventTypeXidCriticalError = 8
nvmlMemory_v2 = 0x02000028
GIB = 1024**3
MIB = 1024**2
__version__ = "13.0-fake"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLLibraryMismatchError(Exception):
    """nvidia-ml-py 13 raises this (not an ``NVMLError``) for a call the driver lacks."""


_FAILURES = {
    "unknown": NVML_ERROR_UNKNOWN,
    "lost": NVML_ERROR_GPU_IS_LOST,
    "not_supported": NVML_ERROR_NOT_SUPPORTED,
}


@dataclass
class FakeGpu:
    uuid: str
    bus: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * GIB
    used: int = 10 * GIB  # as v1 reports it: driver-reserved memory included
    reserved: int = 0
    util: int = 42
    temp: int = 55
    slowdown: int = 87
    shutdown: int = 92
    mig: bool = False
    lost: bool = False
    links: dict[int, str] = field(default_factory=dict)  # link -> remote GPU bus id
    switch_links: dict[int, str] = field(default_factory=dict)  # link -> NVSwitch bus id
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    mps_procs: list[tuple[int, int | None]] = field(default_factory=list)
    fail: dict[str, str] = field(default_factory=dict)  # call name (or "*") -> failure
    minor: int | None = None  # /dev/nvidiaN's N; None: the index, as on most boards


@dataclass
class FakeMig:
    uuid: str
    parent: int
    slot: int
    profile: str = "3g.40gb"
    total: int = 40 * GIB
    used: int = 1 * GIB
    procs: list[tuple[int, int | None]] = field(default_factory=list)


def default_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            "GPU-aaaa",
            "00000000:3B:00.0",
            links={0: "00000000:86:00.0"},
            procs=[(4242, 2 * GIB), (4343, None)],
        ),
        FakeGpu("GPU-bbbb", "00000000:86:00.0", mig=True, links={0: "00000000:3B:00.0"}),
    ]


def hgx_board(count: int = 8, name: str = "NVIDIA H100 80GB HBM3") -> list[FakeGpu]:
    """``count`` GPUs whose every NVLink ends at one of four NVSwitches (HGX/DGX)."""
    switches = [f"00000000:{0xA0 + s:02X}:00.0" for s in range(4)]
    return [
        FakeGpu(
            f"GPU-{i:04x}-hgx",
            f"00000000:{0x10 + i:02X}:00.0",
            name=name,
            switch_links={link: switches[link % 4] for link in range(NVML_NVLINK_MAX_LINKS)},
        )
        for i in range(count)
    ]


class FakeNvml:
    """Behaves like the parts of ``pynvml`` the backend uses."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    def __init__(self, *, driver: bool = True, gpus: list[FakeGpu] | None = None) -> None:
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType", "nvmlMemory_")):
                setattr(self, name, value)
        self.__version__ = __version__
        self.driver = driver
        self.driver_version = "570.86.15"
        self.not_supported: set[str] = set()
        self.gpus = default_gpus() if gpus is None else gpus
        self.migs: list[FakeMig] = [FakeMig("MIG-cccc", parent=1, slot=0)] if gpus is None else []
        self.mig_generation = 0
        self.v2_memory = True
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.shutdown_called = False
        self.calls: list[str] = []
        self._state_file: Path | None = None
        self._state_text: str | None = None

    # -- a state file, for an agent in another process
    @classmethod
    def from_file(cls, path: Path) -> FakeNvml:
        fake = cls(gpus=[])
        fake._state_file = path
        fake._reload()
        return fake

    def _reload(self) -> None:
        if self._state_file is None:
            return
        try:
            text = self._state_file.read_text()
        except OSError:
            return
        if text == self._state_text:
            return
        data = json.loads(text)
        self._state_text = text
        self.gpus = [_gpu_from_json(g) for g in data.get("gpus", [])]
        self.migs = [
            FakeMig(**{**m, "procs": [tuple(p) for p in m.get("procs", [])]})
            for m in data.get("migs", [])
        ]
        self.mig_generation = int(data.get("mig_generation", 0))
        self.not_supported = set(data.get("not_supported", []))
        self.v2_memory = bool(data.get("v2_memory", True))

    # -- plumbing
    def _check(self, fn: str, handle: Any = None) -> None:
        self._reload()
        self.calls.append(fn)
        if fn in self.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(handle)
        if gpu is None:
            return
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        how = gpu.fail.get(fn) or gpu.fail.get("*")
        if how == "mismatch":
            raise NVMLLibraryMismatchError(f"{fn} is not in this driver's NVML")
        if how is not None:
            raise NVMLError(_FAILURES[how])

    def _gpu(self, handle: Any) -> FakeGpu | None:
        if isinstance(handle, int):
            return self.gpus[handle]
        if isinstance(handle, str) and handle.startswith("mig:"):
            mig = self._mig(handle)
            return self.gpus[mig.parent]
        return None

    def _mig(self, handle: str) -> FakeMig:
        _, uuid, generation = handle.split(":")
        if int(generation) != self.mig_generation:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a handle from before a reconfig
        for mig in self.migs:
            if mig.uuid == uuid:
                return mig
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlInit(self) -> None:
        self._reload()
        if not self.driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._reload()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    # -- identity
    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        self._check("nvmlDeviceGetUUID", h)
        if isinstance(h, str):
            return self._mig(h).uuid.encode()
        return self.gpus[h].uuid.encode()

    def nvmlDeviceGetName(self, h: Any) -> str:
        self._check("nvmlDeviceGetName", h)
        if isinstance(h, str):
            mig = self._mig(h)
            return f"{self.gpus[mig.parent].name} MIG {mig.profile}"
        return self.gpus[h].name

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        self._check("nvmlDeviceGetMinorNumber", h)
        minor = self.gpus[h].minor
        return h if minor is None else minor

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        self._check("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=self.gpus[h].bus.lower().encode())

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", h)
        if isinstance(h, str):
            mig = self._mig(h)
            total, used, reserved = mig.total, mig.used, 0
        else:
            g = self.gpus[h]
            total, used, reserved = g.total, g.used, g.reserved
        if version is None:
            return SimpleNamespace(total=total, used=used, free=total - used)
        if not self.v2_memory:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(
            version=version,
            total=total,
            reserved=reserved,
            used=used - reserved,
            free=total - used,
        )

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability", h)
        return (9, 0) if "H100" in self.gpus[h].name or "H200" in self.gpus[h].name else (8, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", h)
        return 400_000

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        self._check("nvmlDeviceGetTemperatureThreshold", h)
        g = self.gpus[h]
        if kind == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return g.shutdown
        return g.slowdown

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        self._check("nvmlDeviceGetAttributes", h)
        if isinstance(h, str):
            mig = self._mig(h)
            return SimpleNamespace(multiprocessorCount=14 * int(mig.profile.split("g")[0]))
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetMigMode", h)
        return (1, 1) if self.gpus[h].mig else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, i: int) -> str:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        for mig in self.migs:
            if mig.parent == h and mig.slot == i:
                return f"mig:{mig.uuid}:{self.mig_generation}"
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return self._mig(h).slot + 1

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        return 0

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", h)
        if link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[h]
        return 1 if link in g.links or link in g.switch_links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", h)
        g = self.gpus[h]
        return SimpleNamespace(busId=g.links.get(link) or g.switch_links[link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        g = self.gpus[h]
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if link in g.switch_links else 0

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        ga, gb = self.gpus[a], self.gpus[b]
        direct = gb.bus in ga.links.values()
        switched = bool(set(ga.switch_links.values()) & set(gb.switch_links.values()))
        return NVML_P2P_STATUS_OK if direct or switched else NVML_P2P_STATUS_NOT_SUPPORTED

    # -- samples
    def _whole_only(self, fn: str, h: Any) -> FakeGpu:
        self._check(fn, h)
        if isinstance(h, str):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # MIG: no utilisation, power, ...
        return self.gpus[h]

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        g = self._whole_only("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util, memory=10)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._whole_only("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        self._whole_only("nvmlDeviceGetPowerUsage", h)
        return 250_500

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        self._whole_only("nvmlDeviceGetClockInfo", h)
        return 1410 if kind == NVML_CLOCK_SM else 1593

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        procs = self._mig(h).procs if isinstance(h, str) else self.gpus[h].procs
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: Any) -> list[Any]:
        self._check("nvmlDeviceGetMPSComputeRunningProcesses", h)
        procs = [] if isinstance(h, str) else self.gpus[h].mps_procs
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]

    # -- events
    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, event_set: str) -> None:
        return None

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        gpu, xid = self.events.pop(0)
        return SimpleNamespace(device=gpu, eventData=xid, eventType=8)

    def nvmlEventSetFree(self, event_set: str) -> None:
        return None


def _gpu_from_json(data: dict[str, Any]) -> FakeGpu:
    g = dict(data)
    for key in ("links", "switch_links"):
        g[key] = {int(k): v for k, v in g.get(key, {}).items()}
    for key in ("procs", "mps_procs"):
        g[key] = [tuple(p) for p in g.get(key, [])]
    return FakeGpu(**g)


def write_state(
    path: Path,
    gpus: list[FakeGpu],
    migs: list[FakeMig] = (),  # type: ignore[assignment]
    *,
    mig_generation: int = 0,
    not_supported: tuple[str, ...] = (),
) -> None:
    """Write the board for :meth:`FakeNvml.from_file` (atomically, so a reader never sees half)."""
    data = {
        "gpus": [asdict(g) for g in gpus],
        "migs": [asdict(m) for m in migs],
        "mig_generation": mig_generation,
        "not_supported": list(not_supported),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
