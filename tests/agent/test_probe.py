"""The GPU probe (``python -m gpupool.agent.probe``) over the fake NVML: its table, and a
non-zero exit on any failure. On a machine without ``libcuda`` the CUDA checks are skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "gpu-check.sh"


def test_the_gpu_check_script_is_valid_bash_and_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(CHECK)], check=False).returncode == 0
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(CHECK)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2
    assert "no NVIDIA GPU or driver found" in out.stderr


def test_the_gpu_check_fails_when_its_probe_fails(tmp_path: Path) -> None:
    # nvidia-smi answers, but there is no driver for NVML: the probe fails, tests/gpu skip.
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-fake)'\n")
    smi.chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHON": sys.executable,
        "GPU_CHECK_BUDGET_S": "240",
    }
    out = subprocess.run(
        [str(CHECK)], env=env, capture_output=True, text=True, timeout=280, check=False
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "probe: FAILED" in out.stdout
    assert "tests/gpu: passed" in out.stdout  # skipped without a driver: nothing failed
