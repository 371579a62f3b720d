"""Builders for control-plane tests: principals, nodes, jobs and agent reports."""

from __future__ import annotations

from typing import Any

from gpupool.control.context import ControlPlane
from gpupool.control.services.auth import Actor, Principal
from gpupool.control.services.heartbeat import HeartbeatService
from gpupool.control.services.jobs import JobService
from gpupool.control.services.nodes import NodeService
from gpupool.domain.jobs import Job
from gpupool.domain.users import Role
from gpupool.schemas.agent import (
    DeviceInfo,
    DeviceTelemetry,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    ReplicaState,
    ReplicaStatus,
    StopReason,
)


def actor(user: str = "admin", role: Role = Role.ADMIN, tenant: str | None = None) -> Actor:
    return Actor(Principal(user, role, tenant, "t"), "POST", "/test", "127.0.0.1")


ADMIN = actor()
AGENT = actor("agent", Role.AGENT)


def register(cp: ControlPlane, node: str = "n1", gpus: int = 2, model: str = "A100-80GB") -> None:
    NodeService(cp).register(
        AGENT,
        RegisterRequest(
            node=node,
            address=f"{node}.local",
            cpu_milli=64000,
            memory_mib=512 * 1024,
            agent_version="test",
            devices=[
                DeviceInfo(uuid=f"{node}-gpu{i}", index=i, model=model, memory_mib=81920)
                for i in range(gpus)
            ],
        ),
    )


def submit(
    cp: ControlPlane, name: str = "j", gpus: str = "0.5", who: Actor = ADMIN, **extra: Any
) -> Job:
    spec: dict[str, Any] = {"name": name, "command": ["sleep", "1"], "resources": {"gpus": gpus}}
    spec.update(extra)
    job, _ = JobService(cp).submit(who, spec)
    return job


def heartbeat(
    cp: ControlPlane,
    node: str = "n1",
    replicas: list[ReplicaStatus] | None = None,
    telemetry: list[DeviceTelemetry] | None = None,
) -> HeartbeatResponse:
    return HeartbeatService(cp).heartbeat(
        AGENT,
        HeartbeatRequest(node=node, epoch=1, replicas=replicas or [], telemetry=telemetry or []),
    )


def running(aid: str) -> ReplicaStatus:
    return ReplicaStatus(assignment_id=aid, state=ReplicaState.RUNNING, isolation="soft")


def exited(
    aid: str, code: int = 0, signal: str | None = None, why: StopReason | None = None
) -> ReplicaStatus:
    return ReplicaStatus(
        assignment_id=aid, state=ReplicaState.EXITED, exit_code=code, signal=signal, stop_reason=why
    )


def leading_cycle(cp: ControlPlane) -> None:
    """One scheduling cycle as the leader (the lease taken and given back)."""
    from gpupool.control.machinery.loop import SchedulingLoop

    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    try:
        loop.cycle()
    finally:
        loop.leadership.release()
