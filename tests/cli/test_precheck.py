"""``gpupool precheck`` on a working simulated pool, from a machine without an NVIDIA driver."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.gpu.base import GpuUnavailable
from gpupool.gpu.nvml import NvmlBackend
from tests.cli.conftest import LocalPool


def _no_driver_here() -> bool:
    try:
        NvmlBackend().close()
    except GpuUnavailable:
        return True
    return False


def test_precheck_on_a_working_simulated_pool_warns_about_the_driver_and_passes(
    pool_env: LocalPool, cli: Any
) -> None:
    if not _no_driver_here():
        pytest.skip("this test is about a machine without an NVIDIA driver")
    r = cli("precheck")
    assert r.exit_code == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("WARN  driver")
    assert "fine for a client or a simulated pool" in lines[0]
    assert lines[1].strip().startswith("fix: install the NVIDIA driver on GPU nodes")
    status = {c["name"]: c["status"] for c in json.loads(cli("precheck", "--json").stdout)}
    assert status["driver"] == "WARN"
    assert status["server"] == status["token"] == status["disk"] == "PASS"
    assert "FAIL" not in status.values()
