"""On a real GPU: NVML inventory and samples, per-process memory, MPS limits, the soft cap.

Each test here fails when the fix it guards is undone (issue 14): NVLink groups are checked
against NVML's own P2P status, a process missing from NVML fails unless the agent can tell why
(another PID namespace), and the MPS test checks that the client attached, its SM share, the
memory limit on a device other than the first where there is one, and that a job's own larger
values are refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpupool.agent import mpsplan
from gpupool.agent.launch import SOFT_HOOK_DIR
from gpupool.agent.node import nvlink_groups
from gpupool.agent.probe import cuda_client
from gpupool.agent.usage import foreign_pids
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
    assert not nvml.problems, nvml.problems
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


def test_gpus_nvml_reports_nvlink_p2p_between_share_an_nvlink_group(nvml: NvmlBackend) -> None:
    nv = nvml._nv
    inv = nvml.inventory()
    if len(inv) < 2:
        pytest.skip("one GPU: no NVLink group to check")
    groups = nvlink_groups(inv)
    for i in range(len(inv)):
        for j in range(i + 1, len(inv)):
            status = nv.nvmlDeviceGetP2PStatus(
                nvml._handles[i], nvml._handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK
            )
            if status == nv.NVML_P2P_STATUS_OK:  # NVSwitch boards: every pair
                assert groups[inv[i].uuid] is not None
                assert groups[inv[i].uuid] == groups[inv[j].uuid]


def test_samples_have_sane_readings_and_no_failed_call(nvml: NvmlBackend) -> None:
    telemetry = nvml.sample()
    assert {s.uuid for s in telemetry.devices} >= {d.uuid for d in nvml.inventory()}
    for s in telemetry.devices:
        assert not s.lost
        assert s.failed_calls == ()
        if s.utilization_ratio is not None:
            assert 0.0 <= s.utilization_ratio <= 1.0
        if s.memory_used_mib is not None:
            assert 0 <= s.memory_used_mib <= s.memory_total_mib
        if s.temperature_c is not None:
            assert 0 < s.temperature_c < 120
        if s.power_w is not None:
            assert 0 <= s.power_w < 2000
    failed = {k: v for k, v in nvml.calls.outcomes.items() if not v.startswith(("ok", "unsup"))}
    assert not failed
    verdicts = HealthTracker(nvml.inventory()).update(telemetry)
    assert all(v.reason is None or "temperature" in v.reason for v in verdicts.values())


def test_a_process_using_the_gpu_shows_in_per_process_memory(nvml: NvmlBackend) -> None:
    device = next((d for d in nvml.inventory() if not d.mig_enabled), None)
    if device is None:
        pytest.skip("every GPU has MIG enabled")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
    with cuda_client(env, 256) as client:
        assert client.ready, client.line
        telemetry = nvml.sample()
        sample = telemetry.by_uuid()[device.uuid]
        mine = [p for p in sample.processes if p.pid == client.proc.pid]
        if not mine:
            # Only acceptable when the agent knows why: pids from another namespace.
            assert foreign_pids(telemetry).get(device.uuid), (
                f"NVML does not list pid {client.proc.pid}: {sample.processes}"
            )
            return
        assert mine[0].used_memory_mib is not None
        assert mine[0].used_memory_mib >= 256


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


def test_mps_client_attaches_with_its_sm_share_and_a_memory_limit_it_cannot_raise(
    nvml: NvmlBackend, mps_binary: str
) -> None:
    whole = [d for d in nvml.inventory() if not d.mig_enabled]
    if not whole:
        pytest.skip("MPS test needs a GPU without MIG")
    device = whole[1] if len(whole) > 1 else whole[0]  # not the first, where there is one
    root = Path("/tmp") / f"gpupool-mps-test-{os.getpid()}"
    daemon = MpsDaemon(root, binary=mps_binary)
    if not daemon.start():
        pytest.skip("the MPS control daemon did not start (another MPS daemon or no rights?)")
    try:
        slice_mib, milli = 2048, 250
        ctx = SliceContext(
            (SliceDevice(device.uuid, device.memory_mib),),
            milli,
            slice_mib,
            mps_pipe_dir=str(daemon.pipe_dir),
            mps_log_dir=str(daemon.log_dir),
        )
        plain = {**os.environ, "CUDA_VISIBLE_DEVICES": device.uuid}
        with cuda_client(plain) as client:  # not through our MPS daemon: every SM
            assert client.ready, client.line
            total = int(client.field("sms"))
        env = {**plain, **isolation_env("mps", ctx)}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        tenant = mpsplan.MpsTenant(os.getuid(), (device.uuid,), milli, slice_mib)
        percentage, memory = mpsplan.server_limits([tenant], tenant.uid)
        assert daemon.limit(tenant.uid, percentage, memory) is None
        with cuda_client(env, slice_mib // 2) as client:
            assert client.ready, client.line
            assert client.field("allocs") == "ok"
            assert client.proc.pid in daemon.clients()  # attached, not silently without MPS
            sms = int(client.field("sms"))
            assert sms <= -(-total * percentage // 100) + 2, f"{sms} SMs of {total} visible"
        with cuda_client(env, slice_mib * 2) as client:
            assert client.field("allocs").startswith("err"), client.line
        override = {
            **env,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device.uuid}=64G",
        }
        with cuda_client(override, slice_mib * 2) as client:
            assert not client.ready or client.field("allocs").startswith("err"), client.line
        assert daemon.healthy()
    finally:
        daemon.stop()
