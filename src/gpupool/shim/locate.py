"""Find the node's real NVIDIA libraries the way the dynamic loader would.

The shim's build reads the real driver's exported names (so the façade forwards every one of
them), and the agent hands the real driver's path to jobs. Both look, in order:

1. the explicit variable (``GPUPOOL_REAL_LIBCUDA`` / ``GPUPOOL_REAL_LIBNVML``);
2. ``LD_LIBRARY_PATH``'s folders, as the loader searches them first;
3. the loader's cache, ``ldconfig -p``;
4. the usual folders of distributions and of the NVIDIA container toolkit and GPU operator
   (``/usr/local/nvidia/lib64``, ``/run/nvidia/driver/...``, WSL's ``/usr/lib/wsl/lib``).

A library inside a shim build of gpupool (the façade itself) is never taken for the real one. The
CUDA toolkit's link-time stubs (``.../stubs/libcuda.so``) are never taken either: they export
the names but cannot run anything.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

#: Where a driver usually is, after LD_LIBRARY_PATH and the loader's cache.
USUAL_FOLDERS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",  # NVIDIA container toolkit (legacy hooks), Kubernetes images
    "/usr/local/nvidia/lib",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",  # the GPU operator's driver container
    "/run/nvidia/driver/usr/lib64",
    "/usr/lib/wsl/lib",
)


def _acceptable(path: Path) -> bool:
    """A real library: not the façade of gpupool (a ``facade`` folder of a shim build, which holds
    ``libgpupool_region.so`` beside it, wherever the build cache is), not a toolkit stub."""
    text = str(path)
    facade = (path.parent.parent / "libgpupool_region.so").exists()
    return path.is_file() and not facade and "gpupool/shim" not in text and "/stubs/" not in text


@functools.lru_cache(maxsize=8)
def _ldconfig(soname: str) -> Path | None:
    """What the loader's cache lists for ``soname`` on this machine's architecture."""
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    arm = platform.machine() in ("aarch64", "arm64")
    for line in out.splitlines():
        name, _, path = line.strip().partition(" => ")
        if not name.startswith(soname + " ") or not path:
            continue
        if ("AArch64" in name) != arm and ("x86-64" in name or "AArch64" in name):
            continue  # another architecture's copy (a multilib machine)
        if _acceptable(Path(path)):
            return Path(path).resolve()
    return None


def find_library(soname: str, variable: str) -> Path | None:
    """The real ``soname`` (``libcuda.so.1``, ``libnvidia-ml.so.1``) or ``None``.

    An explicit ``variable`` that names no file gives ``None`` (it is not second-guessed)."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit).resolve() if Path(explicit).is_file() else None
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and _acceptable(Path(folder) / soname):
            return (Path(folder) / soname).resolve()
    cached = _ldconfig(soname)
    if cached is not None:
        return cached
    for folder in USUAL_FOLDERS:
        if _acceptable(Path(folder) / soname):
            return (Path(folder) / soname).resolve()
    return None


def real_driver() -> Path | None:
    """The node's real ``libcuda.so.1``."""
    return find_library("libcuda.so.1", "GPUPOOL_REAL_LIBCUDA")


def real_nvml() -> Path | None:
    """The node's real ``libnvidia-ml.so.1``: the explicit variable, else beside the driver,
    else as the loader would find it."""
    if os.environ.get("GPUPOOL_REAL_LIBNVML"):
        return find_library("libnvidia-ml.so.1", "GPUPOOL_REAL_LIBNVML")
    driver = real_driver()
    if driver is not None and _acceptable(driver.parent / "libnvidia-ml.so.1"):
        return (driver.parent / "libnvidia-ml.so.1").resolve()
    return find_library("libnvidia-ml.so.1", "GPUPOOL_REAL_LIBNVML")
