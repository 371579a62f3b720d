"""GPU-only tests: they run on a machine with an NVIDIA GPU and driver, and skip elsewhere.

Run them with ``scripts/gpu-check.sh`` (under 5 minutes). Tests that also need PyTorch or the
MPS control binary skip with a clear message when those are missing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from types import ModuleType

import pytest

from gpupool.gpu.base import GpuUnavailable
from gpupool.gpu.nvml import NvmlBackend

pytestmark = pytest.mark.gpu


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def nvml() -> Iterator[NvmlBackend]:
    try:
        backend = NvmlBackend()
    except GpuUnavailable as exc:
        pytest.skip(f"no GPU: {exc}")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def torch() -> ModuleType:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


@pytest.fixture(scope="session")
def mps_binary() -> str:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    return path
