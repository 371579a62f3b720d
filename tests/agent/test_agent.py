"""The agent against an in-process fake server: protocol rules, env, adoption, memory rules."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.agent.jobfiles import EXITED
from gpupool.agent.transport import ServerUnavailable
from gpupool.control.machinery.clock import ManualClock, SystemClock
from gpupool.gpu.simulated import SimulatedBackend
from gpupool.schemas.agent import (
    ArrayInfo,
    AssignmentSpec,
    GangInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    ReplicaState,
    ReplicaStatus,
    StopOrder,
    StopReason,
)
from tests.agent.helpers import wait_for

PY = sys.executable
DUMP_ENV = (
    "import json,os,sys; json.dump(dict(os.environ), open(sys.argv[1], 'w')); "
    "sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)"
)


class FakeServer:
    """Answers register/heartbeat from a queue; records every request."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        self.down = False
        self.requests: list[HeartbeatRequest] = []
        self.registrations: list[RegisterRequest] = []
        self.queue: list[HeartbeatResponse] = []
        self.lock = threading.Lock()

    def register(self, request: RegisterRequest) -> RegisterResponse:
        if self.down:
            raise ServerUnavailable("down")
        self.registrations.append(request)
        return RegisterResponse(
            node_id="n1", epoch=self.epoch, heartbeat_interval_s=0.2, server_version="t"
        )

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        with self.lock:
            if self.down:
                raise ServerUnavailable("down")
            self.requests.append(request)
            if self.queue:
                return self.queue.pop(0)
            return HeartbeatResponse(epoch=self.epoch, heartbeat_interval_s=0.2)

    def close(self) -> None:
        return None

    def last(self, key: str) -> ReplicaStatus | None:
        for request in reversed(self.requests):
            for r in request.replicas:
                if r.assignment_id == key:
                    return r
        return None


def assignment(key: str, tmp: Path, *args: str, **kw: object) -> AssignmentSpec:
    base: dict[str, object] = {
        "assignment_id": key,
        "epoch": 1,
        "job_id": f"job-{key}",
        "job_name": "t",
        "replica_rank": 0,
        "command": [PY, "-c", DUMP_ENV, str(tmp / f"{key}.env"), *args],
        "device_uuids": [],
        "milli_per_device": 500,
        "memory_mib_per_device": 1024,
    }
    base.update(kw)
    return AssignmentSpec(**base)  # type: ignore[arg-type]


def make_agent(tmp: Path, server: FakeServer, spec: str = "2xA100-80GB", clock=None) -> Agent:  # type: ignore[no-untyped-def]
    backend = SimulatedBackend.from_spec(spec, node="n1")
    config = AgentConfig(
        node="n1",
        state_dir=tmp / "state",
        address="10.0.0.1",
        watchdog_grace_s=0.0,
        local_tick_s=0.05,
    )
    return Agent(config, backend, server, clock or SystemClock())


def drive(agent: Agent, server: FakeServer, key: str, state: ReplicaState) -> ReplicaStatus:
    def probe() -> ReplicaStatus | None:
        agent.observe()
        agent.heartbeat()
        seen = server.last(key)
        return seen if seen is not None and seen.state is state else None

    return wait_for(probe, what=f"{key} {state.value}")


def test_a_job_gets_its_devices_slice_and_gang_variables(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    agent.register()
    uuids = [d.uuid for d in agent.devices]
    gang = GangInfo(master_addr="10.0.0.1", master_port=29500, world_size=2, rank=1, local_rank=0)
    server.queue.append(
        HeartbeatResponse(
            epoch=1,
            heartbeat_interval_s=0.2,
            start=[
                assignment(
                    "a1",
                    tmp_path,
                    device_uuids=uuids,
                    milli_per_device=1000,
                    memory_mib_per_device=81920,
                    gang=gang,
                    restart_count=2,
                    env={"MINE": "yes", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/not-ours"},
                )
            ],
        )
    )
    agent.heartbeat()
    done = drive(agent, server, "a1", ReplicaState.EXITED)
    assert done.exit_code == 0
    assert done.isolation == "exclusive"
    env = json.loads((tmp_path / "a1.env").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["GPUPOOL_JOB_ID"] == "job-a1"
    assert env["GPUPOOL_RESTART_COUNT"] == "2"
    assert env["GPUPOOL_GPU_MILLI"] == "1000"
    assert env["GPUPOOL_GPU_MEMORY_MIB"] == "81920"
    assert env["GPUPOOL_CHECKPOINT_DIR"].endswith("job-a1")
    assert Path(env["GPUPOOL_CHECKPOINT_DIR"]).is_dir()
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == (
        "10.0.0.1",
        "29500",
        "2",
        "1",
    )
    assert env["LOCAL_RANK"] == "0"
    assert env["MINE"] == "yes"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env  # reserved names never reach the job
    # the server acknowledges: the agent forgets it and stops reporting it
    server.queue.append(HeartbeatResponse(epoch=1, heartbeat_interval_s=0.2, finished_ack=["a1"]))
    agent.heartbeat()
    agent.heartbeat()
    assert all(r.assignment_id != "a1" for r in server.requests[-1].replicas)


def test_an_array_task_gets_its_index_and_the_arrays_bounds(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    agent.register()
    task = ArrayInfo(array_id="a1b2c3", index=7, count=3, first=5, last=9)
    server.queue.append(
        HeartbeatResponse(
            epoch=1,
            heartbeat_interval_s=0.2,
            start=[
                assignment(
                    "t7",
                    tmp_path,
                    array=task,
                    env={"GPUPOOL_ARRAY_TASK_ID": "forged"},  # reserved: never reaches the job
                )
            ],
        )
    )
    agent.heartbeat()
    assert drive(agent, server, "t7", ReplicaState.EXITED).exit_code == 0
    env = json.loads((tmp_path / "t7.env").read_text())
    assert {k: v for k, v in env.items() if k.startswith("GPUPOOL_ARRAY_")} == {
        "GPUPOOL_ARRAY_JOB_ID": "a1b2c3",
        "GPUPOOL_ARRAY_TASK_ID": "7",
        "GPUPOOL_ARRAY_TASK_COUNT": "3",
        "GPUPOOL_ARRAY_TASK_MIN": "5",
        "GPUPOOL_ARRAY_TASK_MAX": "9",
    }


def test_fractional_job_on_simulated_gpu_gets_soft_isolation_env(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    uuid = agent.devices[1].uuid
    agent.apply_start(
        assignment(
            "a1", tmp_path, device_uuids=[uuid], milli_per_device=250, memory_mib_per_device=20480
        )
    )
    done = drive(agent, server, "a1", ReplicaState.EXITED)
    env = json.loads((tmp_path / "a1.env").read_text())
    assert done.isolation == "soft"
    assert env["GPUPOOL_ISOLATION"] == "soft"
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.250"
    assert env["PYTHONPATH"].split(":")[0].endswith("softhook")


def test_duplicate_and_stale_orders_do_nothing(tmp_path: Path) -> None:
    server = FakeServer(epoch=5)
    agent = make_agent(tmp_path, server)
    agent.register()
    counter = tmp_path / "starts"
    once = assignment(
        "a1",
        tmp_path,
        epoch=5,
        command=[PY, "-c", f"open({str(counter)!r}, 'a').write('x'); import time; time.sleep(30)"],
    )
    assert agent.apply_start(once)
    assert not agent.apply_start(once)  # resent: already known
    assert not agent.apply_start(assignment("old", tmp_path, epoch=4))  # from a deposed leader
    drive(agent, server, "a1", ReplicaState.RUNNING)
    wait_for(counter.exists, what="the job to start")
    # a late answer from epoch 4 with a stop order changes nothing
    agent.handle(
        HeartbeatResponse(
            epoch=4,
            heartbeat_interval_s=0.2,
            stop=[
                StopOrder(assignment_id="a1", epoch=4, reason=StopReason.CANCEL, grace_period_s=0)
            ],
        )
    )
    assert not agent.apply_stop(StopOrder(assignment_id="a1", epoch=4, reason=StopReason.CANCEL))
    assert not agent.apply_stop(StopOrder(assignment_id="nope", epoch=5, reason=StopReason.CANCEL))
    assert agent.executor.observe("a1").status == "running"
    assert "old" not in agent.replicas
    # a current stop works, and repeating it is harmless
    order = StopOrder(assignment_id="a1", epoch=5, reason=StopReason.PREEMPT, grace_period_s=5)
    agent.handle(HeartbeatResponse(epoch=5, heartbeat_interval_s=0.2, stop=[order, order]))
    done = drive(agent, server, "a1", ReplicaState.EXITED)
    assert done.stop_reason is StopReason.PREEMPT
    assert done.signal == "SIGTERM"
    assert counter.read_text() == "x"


def test_the_epoch_survives_an_agent_restart(tmp_path: Path) -> None:
    server = FakeServer(epoch=7)
    make_agent(tmp_path, server).register()
    again = make_agent(tmp_path, server)
    assert again.epoch == 7
    assert not again.apply_start(assignment("a", tmp_path, epoch=6))


def test_unknown_devices_and_missing_workdir_are_boot_failures(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    agent.apply_start(assignment("bad-dev", tmp_path, device_uuids=["GPU-elsewhere"]))
    agent.apply_start(assignment("bad-dir", tmp_path, workdir=str(tmp_path / "missing")))
    agent.observe()
    agent.heartbeat()
    dev, wd = server.last("bad-dev"), server.last("bad-dir")
    assert dev is not None
    assert wd is not None
    assert dev.state is ReplicaState.BOOT_FAILED
    assert "GPU-elsewhere" in (dev.reason or "")
    assert wd.state is ReplicaState.BOOT_FAILED
    assert "does not exist" in (wd.reason or "")


def test_a_restarted_agent_adopts_running_jobs_and_reports_their_exit(tmp_path: Path) -> None:
    server = FakeServer()
    first = make_agent(tmp_path, server)
    go = tmp_path / "go"
    starts = tmp_path / "starts"
    code = (
        f"import os,time; open({str(starts)!r},'a').write('x')\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    )
    first.apply_start(assignment("a1", tmp_path, command=[PY, "-c", code]))
    drive(first, server, "a1", ReplicaState.RUNNING)
    second = make_agent(tmp_path, server)
    assert second.adopt() == ["a1"]
    drive(second, server, "a1", ReplicaState.RUNNING)
    assert not second.apply_start(assignment("a1", tmp_path, command=[PY, "-c", code]))
    go.write_text("")
    done = drive(second, server, "a1", ReplicaState.EXITED)
    assert done.exit_code == 4
    assert starts.read_text() == "x"


def test_jobs_keep_running_while_the_server_is_away(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    stop = threading.Event()
    go = tmp_path / "go"
    code = f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    server.queue.append(
        HeartbeatResponse(
            epoch=1,
            heartbeat_interval_s=0.2,
            start=[assignment("a1", tmp_path, command=[PY, "-c", code])],
        )
    )
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: (r := server.last("a1")) is not None and r.state is ReplicaState.RUNNING)
        server.down = True
        wait_for(lambda: agent.backoff.failures >= 2, what="failed heartbeats")
        assert agent.executor.observe("a1").status == "running"
        go.write_text("")
        wait_for(lambda: agent.executor.observe("a1").status == "exited")
        server.down = False
        wait_for(
            lambda: (r := server.last("a1")) is not None and r.state is ReplicaState.EXITED,
            what="the exit reported after reconnecting",
        )
    finally:
        stop.set()
        thread.join(timeout=10)


def test_watchdog_stops_a_soft_job_over_its_memory(tmp_path: Path) -> None:
    server = FakeServer()
    clock = ManualClock(1000.0)
    agent = make_agent(tmp_path, server, clock=clock)
    uuid = agent.devices[0].uuid
    agent.apply_start(
        assignment(
            "hog",
            tmp_path,
            device_uuids=[uuid],
            milli_per_device=500,
            memory_mib_per_device=4096,
            env={"SIMGPU_LOAD": "mem=8GiB"},
            command=[PY, "-c", "import time; time.sleep(60)"],
        )
    )
    drive(agent, server, "hog", ReplicaState.RUNNING)
    clock.advance(1.0)
    done = drive(agent, server, "hog", ReplicaState.EXITED)
    assert done.stop_reason is StopReason.MEMORY
    assert "over its slice" in (done.reason or "")


def test_memory_pressure_preempts_the_lowest_priority_opportunistic_job(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server, spec="1xT4")
    uuid = agent.devices[0].uuid
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    for key, prio in (("low", 100), ("mid", 500)):
        agent.apply_start(
            assignment(
                key,
                tmp_path,
                device_uuids=[uuid],
                milli_per_device=500,
                memory_mib_per_device=8192,
                priority=prio,
                preemptible=True,
                env={"SIMGPU_LOAD": "mem=7600MiB"},
                command=sleep,
                grace_period_s=1,
            )
        )
    drive(agent, server, "mid", ReplicaState.RUNNING)
    done = drive(agent, server, "low", ReplicaState.EXITED)
    assert done.stop_reason is StopReason.PRESSURE
    assert "memory pressure" in (done.reason or "")
    assert agent.executor.observe("mid").status == "running"
    agent.executor.stop("mid", reason="cancel", signal_name="SIGKILL", grace_s=0)


def test_a_lost_gpu_is_reported_unhealthy(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    assert isinstance(agent.backend, SimulatedBackend)
    lost = agent.devices[1].uuid
    agent.backend.lose(lost)
    agent.heartbeat()
    by = {t.uuid: t for t in server.requests[-1].telemetry}
    assert not by[lost].healthy
    assert by[lost].xid == 79
    assert by[agent.devices[0].uuid].healthy


def test_registration_describes_the_node(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server, spec="4xA100-80GB,2xT4")
    agent.register()
    (req,) = server.registrations
    assert req.node == "n1"
    assert req.address == "10.0.0.1"
    assert len(req.devices) == 6
    assert {d.nvlink_group for d in req.devices[:4]} == {0}
    assert req.devices[4].nvlink_group is None
    assert req.isolation_modes == ["exclusive", "soft"]
    assert req.cpu_milli == (os.cpu_count() or 1) * 1000


@pytest.fixture(autouse=True)
def _no_stray_jobs(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    # kill whatever a failed test left running
    jobs = tmp_path / "state" / "jobs"
    if jobs.exists():
        for state in jobs.glob("*/state.json"):
            data = json.loads(state.read_text())
            if data.get("pid"):
                with contextlib.suppress(OSError):
                    os.killpg(int(data["pid"]), 9)


class _UploadServer(FakeServer):
    """A fake server whose upload download hands out an archive that climbs out."""

    def download_upload(self, upload_id: str, dest: Path) -> None:
        import io
        import tarfile

        with tarfile.open(dest, "w:gz") as tar:
            info = tarfile.TarInfo("../evil.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))


def test_a_refused_uploaded_workdir_is_a_boot_failure_with_the_reason(tmp_path: Path) -> None:
    server = _UploadServer()
    agent = make_agent(tmp_path, server)
    a = assignment("up", tmp_path)
    agent.apply_start(a.model_copy(update={"workdir_upload": "ab" * 16}))
    # the replica's supervisor unpacks it (agent/jobsteps.py), not the agent
    wait_for(lambda: agent.executor.observe("up").status == "boot_failed", 60, "the refusal")
    agent.observe()
    agent.heartbeat()
    got = server.last("up")
    assert got is not None
    assert got.state is ReplicaState.BOOT_FAILED
    assert "points outside the working directory" in (got.reason or "")
    assert not list(tmp_path.rglob("evil.txt"))


class _NoUploadServer(FakeServer):
    """A fake server whose upload download fails (the upload was pruned, the link dropped)."""

    def download_upload(self, upload_id: str, dest: Path) -> None:
        raise ServerUnavailable(f"upload {upload_id} is gone")


def test_an_upload_that_cannot_be_downloaded_is_a_boot_failure_with_the_reason(
    tmp_path: Path,
) -> None:
    agent = make_agent(tmp_path, _NoUploadServer())
    a = assignment("gone", tmp_path)
    assert agent.apply_start(a.model_copy(update={"workdir_upload": "cd" * 16}))
    # downloaded in a thread of its own; the supervisor waits for it and fails the replica
    seen = wait_for(
        lambda: (o := agent.executor.observe("gone")).status == "boot_failed" and o,
        60,
        "the boot failure",
    )
    assert "cannot download working directory upload" in (seen.reason or "")
    assert "is gone" in (seen.reason or "")


class SlowBeatServer(FakeServer):
    """A server that asks for a heartbeat only every 60 s, and answers the first heartbeat
    reporting ``a1`` running only once ``a1`` has exited (``hold``): the exit then happens
    during a heartbeat round, and the agent must still report it now, not 60 s later."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: Callable[[], None] | None = None

    def register(self, request: RegisterRequest) -> RegisterResponse:
        answer = super().register(request)
        return answer.model_copy(update={"heartbeat_interval_s": 60.0})

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        reports = {r.assignment_id: r.state for r in request.replicas}
        if reports.get("a1") is ReplicaState.RUNNING and self.hold is not None:
            hold, self.hold = self.hold, None
            hold()
        answer = super().heartbeat(request)
        return answer.model_copy(update={"heartbeat_interval_s": 60.0})


def test_a_replica_that_ends_during_a_heartbeat_round_is_reported_without_waiting_the_interval(
    tmp_path: Path,
) -> None:
    server = SlowBeatServer()
    server.queue.append(
        HeartbeatResponse(
            epoch=1,
            heartbeat_interval_s=60.0,
            start=[assignment("a1", tmp_path, command=[PY, "-c", "import time; time.sleep(1)"])],
        )
    )
    agent = make_agent(tmp_path, server)

    def until_a1_exited() -> None:
        wait_for(
            lambda: agent.executor.observe("a1").status == EXITED or None,
            what="a1 to exit while the server holds its heartbeat",
        )

    server.hold = until_a1_exited
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    try:

        def exited() -> ReplicaStatus | None:
            seen = server.last("a1")
            return seen if seen is not None and seen.state is ReplicaState.EXITED else None

        # 20 s: well before the 60 s interval, which is when the old agent reported it
        wait_for(exited, timeout=20, what="a1 reported EXITED before the next 60 s heartbeat")
    finally:
        stop.set()
        loop.join(timeout=10)
