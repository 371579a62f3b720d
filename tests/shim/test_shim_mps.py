"""``mps+shim``: on a node that runs MPS, a fractional slice under ``auto`` gets MPS for compute
and the CUDA shim for its own memory limit (MPS's pinned limit is per Unix user's server, so two
replicas of one user cannot be told apart by it). Through the agent, with the fake NVML, the fake
``nvidia-cuda-mps-control`` and the fake driver as the node's real one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.control.machinery.clock import SystemClock
from gpupool.gpu.nvml import NvmlBackend
from gpupool.runtime.isolation import AUTO_ORDER
from gpupool.runtime.shim import Region
from gpupool.schemas.agent import ReplicaState
from tests.agent.fake_mps import install, kill_servers
from tests.agent.fake_nvml import FakeGpu, FakeNvml
from tests.agent.test_agent import DUMP_ENV, FakeServer, assignment, drive
from tests.shim.conftest import MIB
from tests.shim.helpers import Natives, fake_uuid, wait_for

PY = sys.executable
GPU0, GPU1 = fake_uuid(0), fake_uuid(1)


@pytest.fixture
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpupool-mpsshim-", dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def agent(root: Path, natives: Natives, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    install(root / "bin", PY)
    monkeypatch.setattr("gpupool.runtime.mps.PROBE_TIMEOUT_S", 120.0)
    monkeypatch.setenv("PATH", f"{root / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_REAL_LIBNVML", str(natives.fake_nvml))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(root / "regions"))
    fake = FakeNvml(gpus=[FakeGpu(GPU0, "00000000:3B:00.0", used=0),
                          FakeGpu(GPU1, "00000000:86:00.0", used=0)])  # fmt: skip
    settings = AgentConfig(node="n1", state_dir=root / "state", address="10.0.0.1",
                           local_tick_s=0.05, watchdog_grace_s=600.0,
                           measure_context=False)  # fmt: skip
    a = Agent(settings, NvmlBackend(nvml=fake), FakeServer(), SystemClock())
    assert a.mps is not None
    try:
        yield a
    finally:
        for key in list(a.replicas):
            a.executor.stop(key, reason="cancel", signal_name="SIGKILL", grace_s=0)
        kill_servers(a.mps.pipe_dir)


def test_mps_shim_comes_before_mps_in_auto_and_the_node_offers_it(agent: Agent) -> None:
    assert AUTO_ORDER.index("mps+shim") < AUTO_ORDER.index("mps") < AUTO_ORDER.index("shim")
    agent.register()
    assert "mps+shim" in agent.register_request().isolation_modes


def test_two_replicas_of_one_user_each_stop_at_their_own_memory_under_mps(
    agent: Agent, root: Path, natives: Natives
) -> None:
    server = agent.transport
    assert isinstance(server, FakeServer)
    agent.register()
    slices = {"small": 256, "large": 1024}  # MiB, both on GPU0, both of this Unix user
    for key, mib in slices.items():
        feed = "; ".join(f"echo {shlex.quote(c)}" for c in
                         ("init", f"alloc {mib * MIB}", "alloc 1"))  # fmt: skip
        script = (
            f"{shlex.quote(PY)} -c {shlex.quote(DUMP_ENV)} {root / key}.env; "
            f"({feed}; sleep 600) | {natives.probe} > {root / key}.out 2> {root / key}.err"
        )
        a = assignment(key, root, device_uuids=[GPU0], milli_per_device=300,
                       memory_mib_per_device=mib, isolation="auto",
                       command=["/bin/sh", "-c", script])  # fmt: skip
        assert agent.apply_start(a)
        drive(agent, server, key, ReplicaState.RUNNING)
    for key, mib in slices.items():
        out = root / f"{key}.out"
        answers = wait_for(
            lambda o=out: o.exists() and len(lines := o.read_text().splitlines()) >= 3 and lines,
            f"{key}'s probe answers",
        )
        assert answers[:3] == ["ok", answers[1], "err 2"], (key, answers)  # its own limit
        assert answers[1].startswith("ok "), answers
        env = json.loads((root / f"{key}.env").read_text())
        # MPS for compute: the thread percentage; its per-user pinned limit stays set too.
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU0}={mib}M"
        with Region.open(Path(env["GPUPOOL_CUDA_REGION"]), build=natives.shim) as region:
            dev = region.read().device(GPU0)
            # The shim for memory, its pacing off: MPS does the compute share.
            assert (dev.mem_limit_bytes, dev.sm_share_permille) == (mib * MIB, 1000)
            assert dev.used_bytes == mib * MIB

    def reported() -> dict[str, str | None] | None:
        agent.observe()
        agent.heartbeat()
        got = {r.assignment_id: r.isolation for r in server.requests[-1].replicas}
        return got if all(v == "mps+shim" for v in got.values()) else None

    assert wait_for(reported, "both reported as mps+shim") == dict.fromkeys(slices, "mps+shim")


def test_under_mps_shim_a_framework_fraction_leaves_the_slice_whole(
    agent: Agent, root: Path, natives: Natives
) -> None:
    """Issue 25, finding 3: the shim reports the slice as the device's total, so the framework
    fraction (PyTorch's per-process fraction, vLLM's utilisation, JAX's preallocation) must be a
    fraction of the slice, not of the physical GPU: fraction x reported total is what PyTorch
    may use, and it must be the slice less the context reserve, not slice / physical of it."""
    server = agent.transport
    assert isinstance(server, FakeServer)
    agent.register()
    mib = 35_000
    agent._shim_reserve = {GPU0: 512 * MIB}  # as measured at agent start
    feed = "; ".join(f"echo {shlex.quote(c)}" for c in ("init", "info"))
    script = (
        f"{shlex.quote(PY)} -c {shlex.quote(DUMP_ENV)} {root / 'r'}.env; "
        f"({feed}; sleep 600) | {natives.probe} > {root / 'r'}.out 2> {root / 'r'}.err"
    )
    a = assignment("r", root, device_uuids=[GPU0], milli_per_device=300,
                   memory_mib_per_device=mib, isolation="auto",
                   command=["/bin/sh", "-c", script])  # fmt: skip
    assert agent.apply_start(a)
    drive(agent, server, "r", ReplicaState.RUNNING)
    out = root / "r.out"
    answers = wait_for(
        lambda: out.exists() and len(lines := out.read_text().splitlines()) >= 2 and lines,
        "the probe's answers",
    )
    assert answers[0] == "ok", answers
    assert answers[1].startswith("ok "), answers
    total = int(answers[1].split()[2])  # what cuMemGetInfo reports as the device's total
    env = json.loads((root / "r.env").read_text())
    assert env["GPUPOOL_ISOLATION"] == "mps+shim"
    assert total == mib * MIB
    for name in ("GPUPOOL_MEMORY_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        usable_mib = float(env[name]) * total / MIB  # PyTorch: fraction x reported total
        assert mib - 512 - 35 <= usable_mib <= mib - 512, (name, env[name], usable_mib)
