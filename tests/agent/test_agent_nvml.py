"""The agent on the NVML backend over the fake NVML (in-process, with a fake server): the memory
rules as a real NVIDIA driver feeds them, and what the agent does when a job has ended.

Jobs are real processes under supervisors; the fake NVML lists their pids as a driver would.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.control.machinery.clock import SystemClock
from gpupool.gpu.nvml import NvmlBackend
from gpupool.schemas.agent import AssignmentSpec, HeartbeatResponse, ReplicaState, StopReason
from tests.agent.fake_nvml import GIB, MIB, FakeGpu, FakeNvml
from tests.agent.helpers import wait_for
from tests.agent.test_agent import FakeServer, drive

PY = sys.executable
SLEEP = "import time; time.sleep(600)"
#: A pid no Linux machine has (above the largest pid_max): a process of another PID namespace.
FOREIGN_PID = 2**22 + 7


def nvml_agent(tmp: Path, fake: FakeNvml, **config: object) -> tuple[Agent, FakeServer]:
    server = FakeServer()
    options: dict[str, object] = {"watchdog_grace_s": 600.0, "use_mps": False}
    options.update(config)
    settings = AgentConfig(
        node="n1",
        state_dir=tmp / "state",
        address="10.0.0.1",
        local_tick_s=0.05,
        measure_context=False,
        **options,  # type: ignore[arg-type]
    )
    agent = Agent(settings, NvmlBackend(nvml=fake), server, SystemClock())
    agent.register()
    return agent, server


def start(agent: Agent, server: FakeServer, key: str, **kw: object) -> int:
    """Start a sleeping job; returns its pid once it runs."""
    spec: dict[str, object] = {
        "assignment_id": key,
        "epoch": 1,
        "job_id": f"job-{key}",
        "job_name": key,
        "replica_rank": 0,
        "command": [PY, "-c", SLEEP],
        "device_uuids": [agent.devices[0].uuid],
        "milli_per_device": 500,
        "memory_mib_per_device": 2048,
        "isolation": "soft",
    }
    spec.update(kw)
    server.queue.append(
        HeartbeatResponse(epoch=1, heartbeat_interval_s=0.2, start=[AssignmentSpec(**spec)])  # type: ignore[arg-type]
    )
    agent.heartbeat()
    drive(agent, server, key, ReplicaState.RUNNING)
    seen = agent.replicas[key].observed
    assert seen is not None
    assert seen.pid is not None
    return seen.pid


def one_gpu(**kw: object) -> FakeNvml:
    kw.setdefault("used", 0)
    gpu = FakeGpu("GPU-one", "00000000:10:00.0", **kw)  # type: ignore[arg-type]
    return FakeNvml(gpus=[gpu])


@pytest.fixture
def cleanup() -> list[Agent]:
    agents: list[Agent] = []
    yield agents  # type: ignore[misc]
    for agent in agents:
        for key in list(agent.replicas):
            agent.executor.stop(key, reason="cancel", signal_name="SIGKILL", grace_s=0)


def test_a_job_at_its_cap_plus_the_cuda_context_is_not_stopped_as_out_of_memory(
    tmp_path: Path, cleanup: list[Agent]
) -> None:
    fake = one_gpu(name="NVIDIA H100 80GB HBM3")
    agent, server = nvml_agent(tmp_path, fake, watchdog_grace_s=0.0, release_wait_s=0.0)
    cleanup.append(agent)
    pid = start(agent, server, "jax")
    # A JAX job preallocates its whole fraction (2 GiB); NVML adds the Hopper context.
    fake.gpus[0].procs = [(pid, (2048 + 500) * MIB)]
    fake.gpus[0].used = (2048 + 500) * MIB
    for _ in range(3):
        agent.heartbeat()
    assert not agent.executor.is_stopping("jax")
    assert agent.replicas["jax"].local_reason is None
    # Far beyond the slice and the context: still stopped.
    fake.gpus[0].procs = [(pid, (2048 + 2000) * MIB)]
    done = drive(agent, server, "jax", ReplicaState.EXITED)
    assert done.stop_reason is StopReason.MEMORY
    assert "context reserve" in (done.reason or "")


def test_the_watchdog_sees_a_job_listed_only_as_an_mps_client(
    tmp_path: Path, cleanup: list[Agent]
) -> None:
    fake = one_gpu()
    agent, server = nvml_agent(tmp_path, fake)
    cleanup.append(agent)
    pid = start(agent, server, "mps")
    fake.gpus[0].mps_procs = [(pid, 6 * GIB)]  # the MPS list, not the compute list
    agent.heartbeat()
    assert "uses 6GiB" in (agent.replicas["mps"].local_reason or "")


def test_an_agent_without_the_host_pid_namespace_falls_back_to_device_totals_and_says_so_once(
    tmp_path: Path, cleanup: list[Agent], caplog: pytest.LogCaptureFixture
) -> None:
    fake = one_gpu()
    agent, server = nvml_agent(tmp_path, fake)
    cleanup.append(agent)
    start(agent, server, "blind")
    fake.gpus[0].procs = [(FOREIGN_PID, 6 * GIB)]  # the host's pid, unknown in this namespace
    fake.gpus[0].used = 6 * GIB
    with caplog.at_level(logging.WARNING, logger="gpupool.agent"):
        agent.heartbeat()
        agent.heartbeat()
    assert "uses 6GiB" in (agent.replicas["blind"].local_reason or "")
    assert sum("PID namespace" in r.getMessage() for r in caplog.records) == 1


def test_memory_pressure_and_the_dashboard_use_memory_without_the_driver_reserve(
    tmp_path: Path, cleanup: list[Agent]
) -> None:
    used = 73830  # MiB the jobs use; the driver reserves 4 GiB more on this 80 GiB GPU
    fake = one_gpu(reserved=4 * GIB, used=4 * GIB)
    agent, server = nvml_agent(tmp_path, fake)
    cleanup.append(agent)
    start(agent, server, "opportunist", preemptible=True)
    fake.gpus[0].used = used * MIB + 4 * GIB  # v1 counts the reserve as used: over 95%
    for _ in range(3):
        agent.heartbeat()
    assert not agent.executor.is_stopping("opportunist")
    (device,) = server.requests[-1].telemetry
    assert device.memory_used_mib == used


def test_an_ended_jobs_memory_still_listed_after_the_wait_frees_the_slice_and_marks_the_gpu(
    tmp_path: Path, cleanup: list[Agent]
) -> None:
    fake = one_gpu()
    agent, server = nvml_agent(tmp_path, fake, release_wait_s=0.0)
    cleanup.append(agent)
    pid = start(agent, server, "stuck", isolation="exclusive", milli_per_device=1000)
    fake.gpus[0].procs = [(pid, 4 * GIB)]
    agent.heartbeat()
    agent.executor.stop("stuck", reason="cancel", signal_name="SIGKILL", grace_s=0)
    drive(agent, server, "stuck", ReplicaState.EXITED)  # the wait (0 s here) ran out

    def unhealthy() -> bool:
        agent.heartbeat()
        return server.requests[-1].telemetry[0].healthy is False

    wait_for(unhealthy, what="the GPU reported unhealthy")
    fake.gpus[0].procs = []  # the driver finally let go
    agent.heartbeat()
    assert server.requests[-1].telemetry[0].healthy is True


def test_a_measured_context_size_replaces_the_default_reserve(
    tmp_path: Path, cleanup: list[Agent]
) -> None:
    # What the agent measured at an earlier start (a small context on this driver).
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "context.json").write_text(
        '{"NVIDIA H100 80GB HBM3 / driver 570.86.15": 200}'
    )
    fake = one_gpu(name="NVIDIA H100 80GB HBM3")
    agent, server = nvml_agent(tmp_path, fake)
    cleanup.append(agent)
    pid = start(agent, server, "measured")
    fake.gpus[0].procs = [(pid, (2048 + 500) * MIB)]  # within the default reserve, not this one
    agent.heartbeat()
    assert "context reserve of 328MiB" in (agent.replicas["measured"].local_reason or "")


def test_measuring_the_context_without_cuda_gives_up_at_once(tmp_path: Path) -> None:
    from gpupool.gpu.context import measure_context_mib

    backend = NvmlBackend(nvml=one_gpu())
    assert measure_context_mib(backend, backend.inventory()[0], timeout_s=60) is None


def test_a_gpus_device_node_is_its_minor_number_not_its_nvml_index() -> None:
    # NVML orders GPUs by PCI bus; the driver numbers /dev/nvidiaN by its own minor numbers.
    # A container (or a kubelet plugin's CDI edits) given /dev/nvidia<index> would get another
    # tenant's GPU wherever the two orders differ.
    fake = FakeNvml(
        gpus=[
            FakeGpu(uuid="GPU-aaaa", bus="00000000:3B:00.0", minor=2),
            FakeGpu(uuid="GPU-bbbb", bus="00000000:5E:00.0", minor=0),
            FakeGpu(uuid="GPU-cccc", bus="00000000:86:00.0"),
        ]
    )
    by_uuid = {d.uuid: d for d in NvmlBackend(nvml=fake).inventory()}
    assert by_uuid["GPU-aaaa"].device_node_minor == 2
    assert by_uuid["GPU-bbbb"].device_node_minor == 0
    assert by_uuid["GPU-cccc"].device_node_minor == 2  # reported as its index, 2
    fake.not_supported = {"nvmlDeviceGetMinorNumber"}
    assert [d.device_node_minor for d in NvmlBackend(nvml=fake).inventory()] == [0, 1, 2]
