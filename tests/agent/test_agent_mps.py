"""MPS isolation through the agent, with the fake NVML and a fake ``nvidia-cuda-mps-control``:
the limits a job gets and where they are set, a job that silently runs without MPS, and two
Unix users on one GPU.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.agent.runas import SUBMITTER
from gpupool.control.machinery.clock import SystemClock
from gpupool.gpu.nvml import NvmlBackend
from gpupool.schemas.agent import ReplicaState
from tests.agent.fake_mps import commands, install, kill_servers, server_pid
from tests.agent.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.agent.test_agent import FakeServer, assignment, drive

PY = sys.executable
HOLD = "import time; time.sleep(600)"


@pytest.fixture
def root() -> Iterator[Path]:
    """A folder others may pass through (jobs of other accounts start in it)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-mps-", dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def two_gpus() -> FakeNvml:
    return FakeNvml(
        gpus=[
            FakeGpu("GPU-aaaa", "00000000:3B:00.0", used=0),
            FakeGpu("GPU-bbbb", "00000000:86:00.0", used=0),
        ]
    )


def mps_agent(
    root: Path, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, **config: object
) -> tuple[Agent, FakeServer]:
    install(root / "bin", PY)
    # The fake binary is a Python script: give it time on a loaded machine.
    monkeypatch.setattr("gpupool.runtime.mps.PROBE_TIMEOUT_S", 120.0)
    monkeypatch.setenv("PATH", f"{root / 'bin'}:{os.environ['PATH']}")
    server = FakeServer()
    state = config.pop("state_dir", root / "state")
    settings = AgentConfig(
        node="n1",
        state_dir=state,  # type: ignore[arg-type]
        address="10.0.0.1",
        local_tick_s=0.05,
        watchdog_grace_s=600.0,
        measure_context=False,
        **config,  # type: ignore[arg-type]
    )
    agent = Agent(settings, NvmlBackend(nvml=fake), server, SystemClock())
    agent.register()
    assert agent.mps is not None
    return agent, server


def stop_all(agent: Agent) -> None:
    for key in list(agent.replicas):
        agent.executor.stop(key, reason="cancel", signal_name="SIGKILL", grace_s=0)
    if agent.mps is not None:
        kill_servers(agent.mps.pipe_dir)


def test_an_mps_job_gets_limits_by_device_uuid_set_on_its_users_server(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, server = mps_agent(root, two_gpus(), monkeypatch)
    assert agent.mps is not None
    a = assignment(
        "m1",
        root,
        device_uuids=["GPU-bbbb"],  # not the first GPU: an ordinal 0 would limit the wrong one
        milli_per_device=250,
        memory_mib_per_device=2048,
        isolation="mps",
    )
    assert agent.apply_start(a)
    try:
        done = drive(agent, server, "m1", ReplicaState.EXITED)
    finally:
        stop_all(agent)
    assert done.isolation == "mps", done.reason
    env = json.loads((root / "m1.env").read_text())
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "GPU-bbbb=2048M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    # JAX and vLLM size memory from the physical total: their fraction keeps them in the slice
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) * 81920 <= 2048
    assert float(env["GPUPOOL_MEMORY_FRACTION"]) * 81920 <= 2048
    # The limits are the server's, so re-exporting the variables in the job raises nothing.
    said = commands(agent.mps.pipe_dir)
    pid = server_pid(agent.mps.pipe_dir, os.getuid())
    assert f"start_server -uid {os.getuid()}" in said
    assert f"set_active_thread_percentage {pid} 25" in said
    assert f"set_device_pinned_mem_limit {pid} GPU-bbbb 2048M" in said


def test_an_mps_job_that_runs_without_mps_is_reported_not_shown_as_mps(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = two_gpus()
    agent, server = mps_agent(root, fake, monkeypatch)
    assert agent.mps is not None
    spec = {"milli_per_device": 500, "memory_mib_per_device": 4096, "isolation": "mps"}
    try:
        for key, uuid in (("attached", "GPU-aaaa"), ("alone", "GPU-bbbb")):
            a = assignment(key, root, device_uuids=[uuid], command=[PY, "-c", HOLD], **spec)
            assert agent.apply_start(a)
        drive(agent, server, "attached", ReplicaState.RUNNING)
        drive(agent, server, "alone", ReplicaState.RUNNING)
        pids = {k: agent.replicas[k].observed.pid for k in ("attached", "alone")}  # type: ignore[union-attr]
        # Both use their GPU; only one is a client of the MPS server.
        fake.gpus[0].procs = [(pids["attached"], 1 * GIB)]
        fake.gpus[1].procs = [(pids["alone"], 1 * GIB)]
        (agent.mps.pipe_dir / "clients").write_text(f"{pids['attached']}\n")
        agent.heartbeat()
        agent.heartbeat()
        reported = {r.assignment_id: r.isolation for r in server.requests[-1].replicas}
        assert reported == {"attached": "mps", "alone": "soft"}
        assert "without MPS" in (agent.replicas["alone"].local_reason or "")
    finally:
        stop_all(agent)


def test_a_pipe_folder_too_long_for_a_socket_gets_a_short_one(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = root / ("x" * 60) / ("y" * 60) / "state"
    agent, _ = mps_agent(root, two_gpus(), monkeypatch, state_dir=deep)
    assert agent.mps is not None
    assert len(str(agent.mps.pipe_dir / "control")) < 100
    assert "mps" in agent.register_request().isolation_modes


def _account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"this machine has no {name!r} account")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")
def test_two_users_jobs_on_one_gpu_are_not_both_placed_under_mps(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _account("nobody")
    _account("daemon")
    agent, server = mps_agent(root, two_gpus(), monkeypatch, run_as=SUBMITTER)
    spec = {"milli_per_device": 500, "memory_mib_per_device": 4096, "isolation": "auto"}
    command = ["/bin/sh", "-c", "sleep 600"]
    try:
        for key, user in (("first", "nobody"), ("second", "daemon"), ("third", "nobody")):
            a = assignment(key, root, user=user, device_uuids=["GPU-aaaa"], command=command, **spec)
            assert agent.apply_start(a)
            drive(agent, server, key, ReplicaState.RUNNING)
        reported = {r.assignment_id: r.isolation for r in server.requests[-1].replicas}
        # MPS serves one Unix user at a time: the second user's client would hang in CUDA
        # start-up until the first user's jobs end. It gets soft isolation instead.
        assert reported == {"first": "mps", "second": "soft", "third": "mps"}
        explicit = assignment(
            "fourth",
            root,
            user="daemon",
            device_uuids=["GPU-aaaa"],
            command=command,
            milli_per_device=500,
            memory_mib_per_device=4096,
            isolation="mps",
        )
        assert agent.apply_start(explicit)
        refused = drive(agent, server, "fourth", ReplicaState.BOOT_FAILED)
        assert "one Unix user at a time" in (refused.reason or "")
    finally:
        stop_all(agent)
