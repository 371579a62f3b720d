"""A small stand-in for the ``pynvml`` module, so the NVML backend is tested without a GPU.

It models two A100s joined by NVLink, the second with MIG enabled and one 3g.40gb instance;
tests can make calls fail (``not_supported``), lose a GPU, or queue XID events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 4
nvmlEventTypeXidCriticalError = 8
GIB = 1024**3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    bus: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * GIB
    used: int = 10 * GIB
    util: int = 42
    mig: bool = False
    lost: bool = False
    links: dict[int, str] = field(default_factory=dict)  # link -> remote bus id
    procs: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """Behaves like the parts of ``pynvml`` the backend uses."""

    NVMLError = NVMLError

    def __init__(self, *, driver: bool = True) -> None:
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, value)
        self.driver = driver
        self.not_supported: set[str] = set()
        self.gpus = [
            FakeGpu(
                "GPU-aaaa",
                "00000000:3B:00.0",
                links={0: "00000000:86:00.0"},
                procs=[(4242, 2 * GIB), (4343, None)],
            ),
            FakeGpu("GPU-bbbb", "00000000:86:00.0", mig=True, links={0: "00000000:3B:00.0"}),
        ]
        self.mig = SimpleNamespace(uuid="MIG-cccc", parent=1, total=40 * GIB, used=1 * GIB)
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.shutdown_called = False

    # -- plumbing
    def _check(self, fn: str, handle: Any = None) -> None:
        if fn in self.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if isinstance(handle, int) and self.gpus[handle].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    # -- identity
    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        return (self.mig.uuid if h == "mig" else self.gpus[h].uuid).encode()

    def nvmlDeviceGetName(self, h: Any) -> str:
        return "NVIDIA A100-SXM4-80GB MIG 3g.40gb" if h == "mig" else self.gpus[h].name

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus.lower().encode())

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if h == "mig":
            return SimpleNamespace(total=self.mig.total, used=self.mig.used)
        self._check("nvmlDeviceGetMemoryInfo", h)
        g = self.gpus[h]
        return SimpleNamespace(total=g.total, used=g.used)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability", h)
        return (8, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", h)
        return 400_000

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        self._check("nvmlDeviceGetTemperatureThreshold", h)
        return 87

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        if h == "mig":
            return SimpleNamespace(multiprocessorCount=42)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetMigMode", h)
        return (1, 1) if self.gpus[h].mig else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, i: int) -> str:
        if h == self.mig.parent and i == 0:
            return "mig"
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return 1

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        return 0

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in self.gpus[h].links else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].links[link])

    # -- samples
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        if h == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._check("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=self.gpus[h].util, memory=10)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        if h == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._check("nvmlDeviceGetTemperature", h)
        return 55

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        if h == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._check("nvmlDeviceGetPowerUsage", h)
        return 250_500

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        if h == "mig":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._check("nvmlDeviceGetClockInfo", h)
        return 1410 if kind == NVML_CLOCK_SM else 1593

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        if h == "mig":
            return []
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.gpus[h].procs]

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
