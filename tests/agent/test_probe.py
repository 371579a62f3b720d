"""The GPU probe (``python -m gpupool.agent.probe``) over the fake NVML: its table, and a
non-zero exit on any failure. On a machine without ``libcuda`` the CUDA checks are skipped.
"""

from __future__ import annotations

import subprocess
import sys

from gpupool.agent.probe import FAIL, PASS, Probe, render
from tests.agent.fake_nvml import FakeGpu, FakeNvml, hgx_board


def statuses(probe: Probe) -> dict[str, str]:
    return {r.check: r.status for r in probe.rows}


def test_the_probe_tables_versions_every_call_memory_and_nvlink() -> None:
    fake = FakeNvml(gpus=hgx_board(2))
    fake.gpus[0].reserved = 512 * 1024 * 1024
    fake.gpus[0].used = 1024 * 1024 * 1024
    probe = Probe(nvml=fake)
    assert probe.run() == 0, render(probe.rows)
    table = render(probe.rows)
    assert "driver 570.86.15" in table
    assert "nvidia-ml-py" in table
    seen = statuses(probe)
    assert seen["sample()"] == PASS
    assert seen["call nvmlDeviceGetComputeRunningProcesses"] == PASS
    assert seen["call nvmlDeviceGetMPSComputeRunningProcesses"] == PASS
    assert "v2 used 512 MiB + reserved 512 MiB" in table
    assert seen["nvlink"] == PASS
    assert "xid events" in seen


def test_a_failing_call_fails_the_probe() -> None:
    gpu = FakeGpu("GPU-one", "00000000:10:00.0", fail={"nvmlDeviceGetPowerUsage": "unknown"})
    probe = Probe(nvml=FakeNvml(gpus=[gpu]))
    assert probe.run() >= 1
    assert statuses(probe)["call nvmlDeviceGetPowerUsage"] == FAIL


def test_the_probe_without_a_driver_exits_non_zero_with_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.agent.probe"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert "driver" in out.stdout
    assert "--simulate" in out.stdout
