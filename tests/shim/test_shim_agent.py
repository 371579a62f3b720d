"""The agent's memory-pressure rule reads a shim replica's usage from its region, not from
NVML's pid mapping: the agent in process (a fake server), simulated GPUs whose NVML figures are
set by each job's synthetic load, and the fake driver as the node's real one."""

from __future__ import annotations

import shlex
from pathlib import Path

from gpupool.schemas.agent import ReplicaState, StopReason
from tests.agent.test_agent import FakeServer, assignment, drive, make_agent
from tests.shim.helpers import Natives, wait_for

GIB = 1 << 30


def _probe_script(natives: Natives, out: Path, name: str, alloc: int) -> str:
    feed = f"echo init; echo {shlex.quote(f'alloc {alloc}')}"
    go = out / f"{name}.go"
    return (
        f"({feed}; while [ ! -e {go} ]; do sleep 0.1; done; echo exit) | "
        f"{natives.probe} > {out / name}.txt 2>&1"
    )


def test_memory_pressure_stops_the_shim_job_whose_region_holds_the_most(
    natives: Natives, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(tmp_path / "regions"))
    server = FakeServer()
    agent = make_agent(tmp_path, server, spec="1xT4")
    uuid = agent.devices[0].uuid
    out = tmp_path / "out"
    out.mkdir()
    # NVML (simulated) says "nvml_big" fills the GPU; its region says it holds 1 GiB. The other
    # holds 6 GiB by its region, next to nothing by NVML. Same priority: the rule stops the one
    # using the most, and only the region knows which that is.
    jobs = {"nvml_big": ("mem=15000MiB", 1 * GIB), "region_big": ("mem=10MiB", 6 * GIB)}
    for key, (load, alloc) in jobs.items():
        agent.apply_start(
            assignment(
                key,
                tmp_path,
                command=[],
                script=_probe_script(natives, out, key, alloc),
                device_uuids=[uuid],
                milli_per_device=500,
                memory_mib_per_device=7168,
                priority=100,
                preemptible=True,
                isolation="shim",
                env={"SIMGPU_LOAD": load},
                grace_period_s=1,
            )
        )
    for key in jobs:  # both hold their memory before the agent's first look
        wait_for(
            lambda k=key: (
                len((out / f"{k}.txt").read_text().split("\n")) > 2
                if (out / f"{k}.txt").exists()
                else None
            ),
            f"{key}'s allocation",
        )
    try:
        # The rule's first choice: one victim per device, and while it is on its way out no
        # other. (Once it has exited, NVML still says "nvml_big" fills the GPU, so the rule
        # goes on to stop that one too: what runs after the first exit is not the question.)
        def pressure_victims() -> set[str] | None:
            agent.observe()
            agent.heartbeat()  # the rules run on the telemetry of a heartbeat
            stopped = {k for k in jobs if agent.replicas[k].local_stop == "pressure"}
            return stopped or None

        assert wait_for(pressure_victims, "the pressure rule's first victim") == {"region_big"}
        done = drive(agent, server, "region_big", ReplicaState.EXITED)
        assert done.stop_reason is StopReason.PRESSURE
        seen = server.last("nvml_big")
        assert seen is not None
        assert seen.isolation == "shim"
    finally:
        for key in jobs:
            (out / f"{key}.go").touch()
            agent.executor.stop(key, reason="cancel", signal_name="SIGKILL", grace_s=0)


def test_a_node_that_cannot_create_regions_runs_auto_jobs_soft_and_refuses_explicit_shim(
    natives: Natives, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(blocked / "regions"))
    server = FakeServer()
    agent = make_agent(tmp_path, server, spec="1xT4")
    uuid = agent.devices[0].uuid
    for key, isolation in (("auto_job", "auto"), ("shim_job", "shim")):
        agent.apply_start(
            assignment(
                key,
                tmp_path,
                device_uuids=[uuid],
                milli_per_device=500,
                memory_mib_per_device=4096,
                isolation=isolation,
            )
        )
    failed = drive(agent, server, "shim_job", ReplicaState.BOOT_FAILED)
    assert "could not create the CUDA shim's slice region" in (failed.reason or "")
    assert "GPUPOOL_SHIM_REGIONS" in (failed.reason or "")
    done = drive(agent, server, "auto_job", ReplicaState.EXITED)
    assert done.exit_code == 0
    assert done.isolation == "soft"
    assert "isolation soft instead of shim" in (done.reason or "")
