"""A real ``gpupool agent`` process on the NVML backend over the fake NVML, against a real
server: what a node with NVIDIA GPUs registers and reports, as the API shows it.

The fake board lives in a JSON state file the agent re-reads on every NVML call, so a test
changes the hardware under a running agent (a GPU heats up, a process lingers, MIG is
reconfigured).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.fake_nvml import GIB, FakeGpu, FakeMig, hgx_board, write_state
from tests.e2e.pool import JOB, PY, Pool, wait_for


class NvmlPool(Pool):
    """A real server, and agents whose NVML is the fake one."""

    def start_nvml_agent(self, node: str, state: Path) -> subprocess.Popen[bytes]:
        log = open(self.root / f"agent-{node}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "tests.agent.fake_nvml_agent",
                str(state),
                "--server",
                self.url,
                "--token-file",
                str(self.agent_token),
                "--node",
                node,
                "--state-dir",
                str(self.state_dir(node)),
                "--address",
                "127.0.0.1",
                "--checkpoint-root",
                str(self.checkpoints),
            ],
            env=self._env(),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.agents[node] = proc

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"agent {node} exited {proc.returncode}:\n{self.log(node)}")
            seen = self.node(node)
            return seen is not None and seen["state"] == "up"

        wait_for(up, 60, f"agent {node} up")
        return proc

    def log(self, node: str) -> str:
        return (self.root / f"agent-{node}.log").read_text(errors="replace")[-3000:]

    def devices_of(self, node: str) -> list[dict[str, Any]]:
        seen = self.node(node)
        assert seen is not None
        return list(seen["devices"])


@pytest.fixture
def nvml_pool(tmp_path: Path) -> Iterator[NvmlPool]:
    pool = NvmlPool(tmp_path, heartbeat_s=0.3)
    try:
        pool.start_server()
        yield pool
    finally:
        pool.close()


def test_an_hgx_node_registers_its_gpus_behind_nvswitches_as_one_nvlink_group(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    state = tmp_path / "board.json"
    write_state(state, hgx_board(8))
    nvml_pool.start_nvml_agent("hgx", state)
    devices = nvml_pool.devices_of("hgx")
    assert len(devices) == 8
    assert {d["nvlink_group"] for d in devices} == {0}


def test_a_gpu_lost_at_boot_and_failing_calls_do_not_stop_the_agent(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    board = hgx_board(8)
    board[3].lost = True  # fell off the bus before the agent started
    board[5].fail = {"nvmlDeviceGetPowerUsage": "unknown"}  # one field fails
    board[6].fail = {"nvmlDeviceGetComputeRunningProcesses": "mismatch"}  # not an NVMLError
    board[7].fail = {"nvmlDeviceGetMemoryInfo": "unknown"}  # the device cannot be watched
    state = tmp_path / "board.json"
    # At boot only GPU 3 is broken: the sample-time failures start once it has registered.
    boot = hgx_board(8)
    boot[3].lost = True
    write_state(state, boot)
    agent = nvml_pool.start_nvml_agent("n1", state)
    devices = nvml_pool.devices_of("n1")
    assert len(devices) == 7
    assert board[3].uuid not in {d["uuid"] for d in devices}
    write_state(state, board)

    def settled() -> dict[str, dict[str, Any]] | None:
        by = {d["uuid"]: d for d in nvml_pool.devices_of("n1")}
        if by[board[7].uuid]["health"] != "unhealthy":
            return None
        return by if by[board[6].uuid]["sampled_at"] is not None else None

    by = wait_for(settled, 60, "GPU 7 unhealthy")
    assert by[board[5].uuid]["health"] == "healthy"
    assert by[board[5].uuid]["power_w"] is None  # that field, that sample: None
    assert by[board[5].uuid]["temperature_c"] == 55.0
    assert by[board[6].uuid]["health"] == "healthy"
    assert by[board[0].uuid]["health"] == "healthy"
    assert agent.poll() is None, nvml_pool.log("n1")
    # said once in the agent's log, not on every sample
    assert nvml_pool.log("n1").count("nvmlDeviceGetPowerUsage") == 1


def test_mig_gpus_register_their_instances_by_profile_and_none_without_instances(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    gpus = [
        FakeGpu("GPU-whole", "00000000:10:00.0", name="NVIDIA H200", total=141 * GIB),
        FakeGpu("GPU-empty", "00000000:20:00.0", name="NVIDIA H200", total=141 * GIB, mig=True),
        FakeGpu("GPU-split", "00000000:30:00.0", name="NVIDIA H200", total=141 * GIB, mig=True),
    ]
    migs = [
        FakeMig("MIG-small", parent=2, slot=0, profile="1g.18gb", total=16 * GIB),
        FakeMig("MIG-big", parent=2, slot=1, profile="3g.71gb", total=70 * GIB),
    ]
    state = tmp_path / "board.json"
    write_state(state, gpus, migs)
    nvml_pool.start_nvml_agent("mig", state)
    by = {d["uuid"]: d for d in nvml_pool.devices_of("mig")}
    assert set(by) == {"GPU-whole", "MIG-small", "MIG-big"}  # GPU-empty: nothing placeable
    assert by["GPU-whole"]["model"] == "NVIDIA H200"
    assert (by["MIG-small"]["model"], by["MIG-small"]["memory_mib"]) == ("MIG 1g.18gb", 16384)
    assert by["MIG-small"]["mig_profile"] == "1g.18gb"
    assert by["MIG-big"]["memory_mib"] == 70 * 1024

    # An admin re-partitions GPU-split: the agent sees the new instances and registers them.
    write_state(
        state,
        gpus,
        [FakeMig("MIG-new", parent=2, slot=0, profile="7g.141gb", total=140 * GIB)],
        mig_generation=1,
    )

    def repartitioned() -> set[str] | None:
        uuids = {d["uuid"] for d in nvml_pool.devices_of("mig")}
        return uuids if "MIG-new" in uuids else None

    wait_for(repartitioned, 60, "the new MIG instance registered")


def test_a_hot_gpu_keeps_working_until_its_shutdown_threshold_without_flapping(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    board = [FakeGpu("GPU-hot", "00000000:10:00.0", temp=60, slowdown=87, shutdown=92)]
    state = tmp_path / "board.json"
    write_state(state, board)
    nvml_pool.start_nvml_agent("hot", state)

    def reads(temp: int, health: str) -> bool:
        (device,) = nvml_pool.devices_of("hot")
        return device["temperature_c"] == float(temp) and device["health"] == health

    for temp, health in ((88, "healthy"), (93, "unhealthy"), (90, "unhealthy"), (80, "healthy")):
        board[0].temp = temp
        write_state(state, board)
        wait_for(lambda t=temp, h=health: reads(t, h), 60, f"{temp}°C reported {health}")  # type: ignore[misc]
    events = nvml_pool.get("/v1/events?kind=alert.temperature")
    assert events  # throttling is an alert, not a failure


def test_a_slice_is_freed_only_once_nvml_no_longer_lists_the_jobs_processes(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    board = [FakeGpu("GPU-one", "00000000:10:00.0", used=0)]
    state = tmp_path / "board.json"
    write_state(state, board)
    nvml_pool.start_nvml_agent("n1", state)
    job_id = nvml_pool.submit("linger", "wait", resources={"gpus": 1})
    nvml_pool.wait_state(job_id, "RUNNING")
    record = wait_for(lambda: nvml_pool.record("linger"), 60, "the job's record")
    board[0].procs = [(int(record["pid"]), 4 * GIB)]
    board[0].used = 4 * GIB
    write_state(state, board)
    (nvml_pool.out / "linger.go").write_text("")  # the job exits; its GPU memory lingers

    def held() -> bool:
        (device,) = nvml_pool.devices_of("n1")
        return bool(device["slices"])

    # The job's process is gone, but NVML still lists it: the slice is not given away yet.
    log = nvml_pool.state_dir("n1") / "jobs"
    wait_for(
        lambda: any(p.name == "state.json" and "exited" in p.read_text() for p in log.rglob("*")),
        60,
        "the supervisor to record the exit",
    )
    # Two more heartbeats: an agent that reports the exit at once has done so by then.
    for _ in range(2):
        seen = nvml_pool.node("n1")
        assert seen is not None
        beat = seen["last_heartbeat"]
        wait_for(lambda b=beat: nvml_pool.node("n1")["last_heartbeat"] > b, 60, "a heartbeat")  # type: ignore[index,misc]
    assert held()
    assert nvml_pool.job(job_id)["state"] == "RUNNING"
    board[0].procs = []
    board[0].used = 0
    write_state(state, board)
    nvml_pool.wait_state(job_id, "COMPLETED")
    assert not held()


ESCAPE = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)  # setsid(): out of the job's process group
open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""


def test_a_child_that_left_the_jobs_session_is_stopped_with_the_job(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    state = tmp_path / "board.json"
    write_state(state, [FakeGpu("GPU-one", "00000000:10:00.0", used=0)])
    nvml_pool.start_nvml_agent("n1", state)
    pid_file, go = tmp_path / "child.pid", tmp_path / "go"
    spec = {"name": "escape", "command": [PY, "-c", ESCAPE, str(pid_file), str(go)]}
    job_id = str(nvml_pool.post("/v1/jobs", {"spec": spec})["job"]["id"])
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "the child"))
    assert _alive(child)
    go.write_text("")  # the job's leader exits; the setsid child would run on
    nvml_pool.wait_state(job_id, "COMPLETED")
    wait_for(lambda: not _alive(child), 60, f"the setsid child {child} to be killed")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
JOB_SETTINGS = {
    "CUDA_HOME": "/usr/local/cuda-12.4",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",  # Megatron-LM needs it
    "CUDA_LAUNCH_BLOCKING": "1",
    "CUDA_MODULE_LOADING": "LAZY",
    "NVIDIA_TF32_OVERRIDE": "0",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def test_a_job_may_set_cuda_and_allocator_settings_but_not_what_gpupool_owns(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    state = tmp_path / "board.json"
    write_state(state, [FakeGpu("GPU-one", "00000000:10:00.0", used=0)])
    nvml_pool.start_nvml_agent("n1", state)
    out = tmp_path / "env.json"
    spec = {
        "name": "megatron",
        "command": [PY, "-c", DUMP_ENV, str(out)],
        "env": JOB_SETTINGS,
        "resources": {"gpus": 1},
    }
    job_id = str(nvml_pool.post("/v1/jobs", {"spec": spec})["job"]["id"])
    nvml_pool.wait_state(job_id, "COMPLETED")
    import json

    seen = json.loads(out.read_text())
    assert {k: seen.get(k) for k in JOB_SETTINGS} == JOB_SETTINGS
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-one"
    assert nvml_pool.http is not None
    for name in (
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "LD_PRELOAD",
        "GPUPOOL_JOB_ID",
        "RANK",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
    ):
        bad = {**spec, "name": "bad", "env": {name: "x"}}
        r = nvml_pool.http.post("/v1/jobs", json={"spec": bad})
        assert r.status_code in (400, 422), (name, r.status_code)
        assert "reserved" in r.text, r.text


def test_a_multi_gpu_job_is_never_given_several_mig_instances(
    nvml_pool: NvmlPool, tmp_path: Path
) -> None:
    gpus = [FakeGpu("GPU-split", "00000000:30:00.0", name="NVIDIA H200", total=141 * GIB, mig=True)]
    migs = [  # CUDA enumerates one MIG instance per process: two would be one
        FakeMig(f"MIG-{i}", parent=0, slot=i, profile="3g.71gb", total=70 * GIB) for i in range(2)
    ]
    state = tmp_path / "board.json"
    write_state(state, gpus, migs)
    nvml_pool.start_nvml_agent("mig", state)
    # a whole H200 asked for by name: a MIG slice of one is not an H200, so no node could hold
    # it and the submit is refused; queued anyway, it never starts on the slices either.
    wanted = {"gpus": 1, "gpu_types": ["H200"]}
    spec = {"name": "whole", "command": [PY, "-c", JOB, str(nvml_pool.out), "sleep=0"]}
    refused = nvml_pool.http.post("/v1/jobs", json={"spec": {**spec, "resources": wanted}})
    assert refused.status_code == 422, refused.text
    assert "no node of pool default has a GPU of type H200" in refused.text
    # two GPUs per replica: the two MIG instances do not make two GPUs, so refused at submit
    # (it used to be stored and pend forever), and queued anyway it never starts
    pair_spec = {**spec, "name": "pair", "resources": {"gpus": 2}}
    refused = nvml_pool.http.post("/v1/jobs", json={"spec": pair_spec})
    assert refused.status_code == 422, refused.text
    assert "MIG instances do not count" in refused.text, refused.text
    assert "--queue-anyway" in refused.text
    pair = str(nvml_pool.post("/v1/jobs", {"spec": pair_spec, "queue_anyway": True})["job"]["id"])
    whole = str(
        nvml_pool.post("/v1/jobs", {"spec": {**spec, "resources": wanted}, "queue_anyway": True})[
            "job"
        ]["id"]
    )
    single = nvml_pool.submit("single", "sleep=0", resources={"gpus": 1})
    nvml_pool.wait_state(single, "COMPLETED")  # scheduled after the others were considered
    assert nvml_pool.job(pair)["state"] == "PENDING"
    assert nvml_pool.job(whole)["state"] == "PENDING"
    assert nvml_pool.starts("pair") == nvml_pool.starts("whole") == []
