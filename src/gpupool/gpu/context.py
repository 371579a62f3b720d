"""The CUDA context reserve: GPU memory a process holds beyond what its framework allocates.

NVML's per-process figure includes the CUDA context (hundreds of MiB on Hopper), loaded module
images and library workspaces; the soft-isolation caps bound only the framework's allocator
(PyTorch's memory fraction, JAX's preallocated fraction). The watchdog therefore allows each
replica its slice **plus** the reserve of its GPU model, or a job at its cap (and every JAX job,
which preallocates its whole fraction) would be stopped as out of memory.

**Measured**: :func:`measure_context_mib` starts a child process that creates a bare CUDA
context through the driver API (``libcuda``, no framework needed) on one device, reads what
NVML lists for that child, and ends it. The agent measures once per GPU model at start and
keeps the figures in its state folder (``context.json``, keyed by model and driver version).
Where it cannot measure (no ``libcuda``, a device in exclusive-process mode that is busy),
:func:`default_context_mib` gives a conservative figure by architecture, and the GPU check
(``scripts/gpu-check.sh``) prints the measured one next to it.

``ALLOWANCE_MIB`` is added for library workspaces (cuBLAS, cuDNN) created after the context.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.gpu.base import DeviceInfo

#: Workspaces that libraries add to a context (cuBLAS/cuDNN handles), in MiB.
ALLOWANCE_MIB = 128

#: Conservative context sizes by compute capability major (MiB), where none was measured:
#: Hopper and Blackwell contexts are the largest (module images for more SMs).
_DEFAULT_BY_MAJOR = {10: 768, 9: 640, 8: 512, 7: 384}

_CHILD = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0, "cuInit"
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
print("ready", flush=True)
sys.stdin.readline()
"""


def default_context_mib(device: DeviceInfo) -> int:
    """The reserve assumed for ``device`` when none was measured."""
    major = device.compute_capability[0] if device.compute_capability else 0
    return _DEFAULT_BY_MAJOR.get(major, 512 if major > 10 else 384)


def measure_context_mib(backend: Any, device: DeviceInfo, timeout_s: float = 60.0) -> int | None:
    """MiB NVML lists for a process holding only a bare CUDA context on ``device``.

    ``backend`` is an open NVML backend (its ``sample()`` lists per-process memory). ``None``
    when the context could not be created or NVML shows no figure for the child.
    """
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return None
    try:
        assert child.stdout is not None
        with selectors.DefaultSelector() as sel:  # CUDA start-up may hang: never block on it
            sel.register(child.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s) or child.stdout.readline().strip() != "ready":
                return None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sample = backend.sample().by_uuid().get(device.uuid)
            mine = [
                p.used_memory_mib
                for p in (sample.processes if sample else ())
                if p.pid == child.pid and p.used_memory_mib
            ]
            if mine:
                return int(mine[0])
            time.sleep(0.2)
        return None
    finally:
        child.kill()
        child.wait()


class ContextReserves:
    """Context reserve per GPU model: measured once and kept in ``path``, else the default."""

    def __init__(self, path: Path, driver: str) -> None:
        self._path = path
        self._driver = driver
        try:
            self._known: dict[str, int] = json.loads(path.read_text())
        except (OSError, ValueError):
            self._known = {}

    def _key(self, device: DeviceInfo) -> str:
        return f"{device.name} / driver {self._driver}"

    def measured(self, device: DeviceInfo) -> int | None:
        return self._known.get(self._key(device))

    def measure(self, backend: Any, devices: tuple[DeviceInfo, ...]) -> None:
        """Measure each model not yet known (one device of each)."""
        done: set[str] = set()
        for d in devices:
            key = self._key(d)
            if key in self._known or key in done or d.mig_enabled:
                continue
            done.add(key)
            mib = measure_context_mib(backend, d)
            if mib is not None:
                self._known[key] = mib
        if done:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.write_text(json.dumps(self._known, indent=1, sort_keys=True))

    def reserve_mib(self, device: DeviceInfo) -> int:
        """What the watchdog allows a process beyond its slice on ``device``."""
        measured = self.measured(device)
        base = measured if measured is not None else default_context_mib(device)
        return base + ALLOWANCE_MIB
