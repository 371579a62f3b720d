"""On a real GPU: NVML inventory and samples, MPS limits, the soft memory cap with PyTorch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpupool.agent.agent import SOFT_HOOK_DIR
from gpupool.gpu.health import HealthTracker
from gpupool.gpu.nvml import NvmlBackend
from gpupool.runtime.isolation import SliceContext, SliceDevice, isolation_env
from gpupool.runtime.mps import MpsDaemon

pytestmark = pytest.mark.gpu

ALLOC = """
import sys, torch
mib = int(sys.argv[1])
try:
    x = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("ok")
except torch.cuda.OutOfMemoryError:
    print("oom")
except RuntimeError as exc:  # MPS reports its limit as a CUDA error
    print("oom" if "out of memory" in str(exc).lower() else f"error {exc}")
"""


def test_inventory_lists_real_devices(nvml: NvmlBackend) -> None:
    devices = nvml.inventory()
    assert devices
    for d in devices:
        assert d.uuid.startswith("GPU-")
        assert d.memory_mib > 1024
        assert d.compute_capability is not None
        assert d.pci_bus_id is not None
        for peer in d.nvlink_peers:
            assert peer in {x.uuid for x in devices}
        for m in d.mig_instances:
            assert m.uuid.startswith("MIG-")
            assert m.parent_uuid == d.uuid


def test_samples_have_sane_readings_and_no_fatal_health(nvml: NvmlBackend) -> None:
    telemetry = nvml.sample()
    assert {s.uuid for s in telemetry.devices} >= {d.uuid for d in nvml.inventory()}
    for s in telemetry.devices:
        assert not s.lost
        if s.utilization_ratio is not None:
            assert 0.0 <= s.utilization_ratio <= 1.0
        if s.memory_used_mib is not None:
            assert 0 <= s.memory_used_mib <= s.memory_total_mib
        if s.temperature_c is not None:
            assert 0 < s.temperature_c < 120
        if s.power_w is not None:
            assert 0 <= s.power_w < 2000
    verdicts = HealthTracker(nvml.inventory()).update(telemetry)
    assert all(v.reason is None or "temperature" in v.reason for v in verdicts.values())


def test_a_process_using_the_gpu_shows_in_per_process_memory(
    nvml: NvmlBackend, torch: ModuleType
) -> None:
    uuid = nvml.inventory()[0].uuid
    code = (
        "import torch,sys,time; x=torch.empty(256*1024*1024, dtype=torch.uint8, device='cuda');"
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(30)"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        sample = nvml.sample().by_uuid()[uuid]
        mine = [p for p in sample.processes if p.pid == proc.pid]
        if not mine:
            pytest.skip("NVML does not show this process (container pid namespace)")
        assert mine[0].used_memory_mib is None or mine[0].used_memory_mib >= 256
    finally:
        proc.kill()
        proc.wait()


def _alloc(env: dict[str, str], mib: int) -> str:
    out = subprocess.run(
        [sys.executable, "-c", ALLOC, str(mib)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]


def test_soft_cap_limits_pytorch_to_its_slice(nvml: NvmlBackend, torch: ModuleType) -> None:
    device = nvml.inventory()[0]
    slice_mib = 2048
    ctx = SliceContext(
        (SliceDevice(device.uuid, device.memory_mib),), 500, slice_mib, soft_hook_dir=SOFT_HOOK_DIR
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
    for key, value in isolation_env("soft", ctx).items():
        env[key] = f"{value}:{env[key]}" if key == "PYTHONPATH" and env.get(key) else value
    assert _alloc(env, slice_mib // 2) == "ok"
    assert _alloc(env, slice_mib * 2) == "oom"


def test_mps_limits_pinned_memory(
    nvml: NvmlBackend, torch: ModuleType, mps_binary: str, tmp_path: Path
) -> None:
    device = nvml.inventory()[0]
    if device.mig_enabled:
        pytest.skip("MPS test needs a GPU without MIG")
    daemon = MpsDaemon(tmp_path / "mps", binary=mps_binary)
    if not daemon.start():
        pytest.skip("the MPS control daemon did not start (another MPS daemon or no rights?)")
    try:
        ctx = SliceContext(
            (SliceDevice(device.uuid, device.memory_mib),),
            250,
            2048,
            mps_pipe_dir=str(daemon.pipe_dir),
            mps_log_dir=str(daemon.log_dir),
        )
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid, **isolation_env("mps", ctx)}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert _alloc(env, 1024) == "ok"
        assert _alloc(env, 4096) == "oom"
        assert daemon.healthy()
    finally:
        daemon.stop()
