"""A shim replica is watched for processes that escape the shim for its whole life (issue 25,
finding 9): one attached process used to stop the agent looking, so a second process that
bypassed the shim (a reset LD_LIBRARY_PATH) was never reported; and the region's usage, which
the job itself writes, is cross-checked with NVML's per-process memory. Through the agent, with
the fake NVML listing the job's processes and the fake driver as the node's real one."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.control.machinery.clock import SystemClock
from gpupool.gpu.nvml import NvmlBackend
from gpupool.schemas.agent import ReplicaState
from tests.agent.fake_nvml import FakeGpu, FakeNvml
from tests.agent.test_agent import FakeServer, assignment, drive
from tests.shim.conftest import MIB
from tests.shim.helpers import Natives, fake_uuid, wait_for

GPU0 = fake_uuid(0)


@pytest.fixture
def setup(
    natives: Natives, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Agent, FakeGpu, Path]]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-escape-", dir="/tmp"))
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_REAL_LIBNVML", str(natives.fake_nvml))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(root / "regions"))
    gpu = FakeGpu(GPU0, "00000000:3B:00.0", used=0)
    settings = AgentConfig(node="n1", state_dir=root / "state", address="10.0.0.1",
                           local_tick_s=0.05, watchdog_grace_s=600.0, measure_context=False,
                           shim_attach_wait_s=0.5)  # fmt: skip
    a = Agent(settings, NvmlBackend(nvml=FakeNvml(gpus=[gpu])), FakeServer(), SystemClock())
    try:
        yield a, gpu, root
    finally:
        for key in list(a.replicas):
            a.executor.stop(key, reason="cancel", signal_name="SIGKILL", grace_s=0)
        shutil.rmtree(root, ignore_errors=True)


def start(agent: Agent, root: Path, natives: Natives, script: str) -> FakeServer:
    server = agent.transport
    assert isinstance(server, FakeServer)
    agent.register()
    a = assignment("r", root, device_uuids=[GPU0], milli_per_device=500,
                   memory_mib_per_device=1024, isolation="shim",
                   command=["/bin/sh", "-c", script])  # fmt: skip
    assert agent.apply_start(a)
    drive(agent, server, "r", ReplicaState.RUNNING)
    return server


def probe_line(natives: Natives, out: Path, commands: list[str], env: str = "") -> str:
    feed = "; ".join(f"echo {shlex.quote(c)}" for c in commands)
    return f"({feed}; sleep 600) | {env} {natives.probe} > {out} 2>&1 & echo $! > {out}.pid"


def pid_of(out: Path) -> int:
    pidfile = out.with_name(out.name + ".pid")
    return int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the pid"))


def test_a_process_that_escapes_beside_an_attached_one_is_reported(setup, natives):
    agent, gpu, root = setup
    shimmed, escaped = root / "a.txt", root / "b.txt"
    # One process under the shim; one that resets LD_LIBRARY_PATH to the driver itself.
    bypass = f"env LD_LIBRARY_PATH={natives.fake.parent} GPUPOOL_CUDA_REGION="
    script = "; ".join([
        probe_line(natives, shimmed, ["init", f"alloc {MIB}"]),
        probe_line(natives, escaped, ["init", f"alloc {512 * MIB}"], bypass),
        "wait",
    ])  # fmt: skip
    server = start(agent, root, natives, script)
    wait_for(lambda: shimmed.exists() and len(shimmed.read_text().split("\n")) > 2, "shimmed")
    wait_for(lambda: escaped.exists() and len(escaped.read_text().split("\n")) > 2, "escaped")
    a_pid, b_pid = pid_of(shimmed), pid_of(escaped)
    gpu.procs = [(a_pid, 64 * MIB), (b_pid, 600 * MIB)]  # NVML lists both on the GPU

    def reported() -> str | None:
        agent.observe()
        agent.heartbeat()
        seen = server.last("r")
        return seen.isolation_reason if seen and seen.isolation == "soft" else None

    reason = wait_for(reported, "the escaped process reported")
    assert f"[{b_pid}]" in reason, reason
    assert "running without the CUDA shim" in reason


def test_a_region_that_holds_less_than_nvml_sees_is_said(setup, natives):
    agent, gpu, root = setup
    out = root / "a.txt"
    server = start(
        agent, root, natives, probe_line(natives, out, ["init", f"alloc {MIB}"]) + "; wait"
    )
    wait_for(lambda: out.exists() and len(out.read_text().split("\n")) > 2, "the allocation")
    gpu.procs = [(pid_of(out), 900 * MIB)]  # NVML: 900 MiB; the region: 1 MiB

    def said() -> str | None:
        agent.observe()
        agent.heartbeat()
        seen = server.last("r")
        why = seen.isolation_reason if seen else None
        return why if why and "NVML lists" in why else None

    why = wait_for(said, "the under-reporting region said")
    assert "900 MiB" in why, why
    assert server.last("r").isolation == "shim"  # reported, not demoted: it may be a context
