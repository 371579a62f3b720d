"""Handling an agent's heartbeat: telemetry, alerts, replica states, and what to send back.

One heartbeat is one transaction: device telemetry and health are updated, alerts raised on a
threshold crossing, usage accrued, each reported replica state applied to its assignment and
job, and the answer built from the store (assignments still to start, stop orders in force,
finished assignments the agent may forget). See :mod:`gpupool.schemas.agent` for the rules.

Alerts: a device reaching ``temperature_alert_c``, or reporting itself unhealthy or an XID
error, writes an ``alert.temperature`` / ``alert.health`` event and a log line when it crosses
the threshold (not on every sample); the metric ``gpupool_alerts`` shows alerts in force.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.jobstate import attempt_outcome, finish_job, move, release_slices
from gpupool.control.services.accounting import accrue
from gpupool.control.services.auth import Actor, require
from gpupool.control.services.nodes import current_epoch
from gpupool.control.services.oversubscription import oversubscription_of, record_spilled
from gpupool.control.services.resize import resize_orders
from gpupool.domain.nodes import DeviceHealth, NodeState
from gpupool.domain.states import JobState
from gpupool.domain.users import Permission
from gpupool.schemas.agent import (
    ArrayInfo,
    AssignmentSpec,
    DeviceTelemetry,
    GangInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    ReplicaState,
    ReplicaStatus,
    StopOrder,
    StopReason,
)
from gpupool.store.models import (
    AssignmentModel,
    DeviceModel,
    EventModel,
    JobModel,
    NodeModel,
    SliceModel,
)

log = logging.getLogger("gpupool.control.alerts")

#: Server-side stop reasons and how they travel on the wire ("gang": a sibling replica ended).
WIRE_STOP_REASON: dict[str, StopReason] = {
    "cancel": StopReason.CANCEL,
    "preempt": StopReason.PREEMPT,
    "timeout": StopReason.TIMEOUT,
    "gang": StopReason.CANCEL,
}


#: Isolation modes a job's record may say it got (anything else is not recorded).
_ISOLATIONS = ("exclusive", "mps", "soft", "mig", "shim", "mps+shim")


def _kill_at_once(assignment_ids: Iterable[str], epoch: int) -> list[StopOrder]:
    """Stop orders for replicas that must not run a moment longer (SIGKILL, no grace)."""
    return [
        StopOrder(
            assignment_id=aid,
            epoch=epoch,
            reason=StopReason.CANCEL,
            signal="SIGKILL",
            grace_period_s=0.0,
        )
        for aid in assignment_ids
    ]


def _alert(s: Session, now: float, kind: str, subject: str, message: str) -> None:
    log.warning("alert %s: %s", kind, message)
    s.add(EventModel(time=now, kind=kind, subject=subject, message=message))


def apply_telemetry(
    s: Session, node: str, samples: list[DeviceTelemetry], now: float, hot_c: float
) -> None:
    devices = {d.uuid: d for d in s.scalars(select(DeviceModel).where(DeviceModel.node == node))}
    for t in samples:
        dev = devices.get(t.uuid)
        if dev is None:
            continue
        was_hot = dev.temperature_c is not None and dev.temperature_c >= hot_c
        if t.temperature_c is not None and t.temperature_c >= hot_c and not was_hot:
            _alert(
                s,
                now,
                "alert.temperature",
                dev.uuid,
                f"device {dev.uuid} on {node} is at {t.temperature_c:.0f} C "
                f"(alert at {hot_c:.0f} C): check its cooling",
            )
        bad = not t.healthy or t.xid is not None
        if bad and dev.health != DeviceHealth.UNHEALTHY.value:
            why = f"XID {t.xid}" if t.xid is not None else "reported unhealthy"
            _alert(
                s,
                now,
                "alert.health",
                dev.uuid,
                f"device {dev.uuid} on {node} {why}: no new work is placed on it until it "
                "reports healthy again",
            )
        dev.health = DeviceHealth.UNHEALTHY.value if bad else DeviceHealth.HEALTHY.value
        dev.utilization_ratio = t.utilization_ratio
        dev.memory_used_mib = t.memory_used_mib
        dev.temperature_c = t.temperature_c
        dev.power_w = t.power_w
        dev.xid = t.xid
        dev.sampled_at = now


def _finish_assignment(s: Session, a: AssignmentModel, rep: ReplicaStatus, now: float) -> None:
    slices = list(
        s.scalars(
            select(SliceModel).where(SliceModel.assignment_id == a.id, SliceModel.active.is_(True))
        )
    )
    accrue(s, slices, now)
    release_slices(s, [a.id])
    a.state = "finished"
    a.ended_at = now
    a.exit_code = rep.exit_code
    a.signal = rep.signal
    if rep.state is ReplicaState.BOOT_FAILED:
        a.stop_reason = a.stop_reason or "boot"
    elif rep.stop_reason is not None and a.stop_reason is None:
        a.stop_reason = rep.stop_reason.value
    job = s.get(JobModel, a.job_id)
    if job is None:
        return
    attempt = list(
        s.scalars(
            select(AssignmentModel).where(
                AssignmentModel.job_id == a.job_id, AssignmentModel.attempt == a.attempt
            )
        )
    )
    live = [x for x in attempt if x.state != "finished"]
    failed = not (rep.exit_code == 0 and rep.signal is None) and a.stop_reason is None
    if live:
        if failed or a.stop_reason in ("boot", "memory", "pressure", "node"):
            for other in live:  # a gang lives and dies together
                if other.stop_reason is None:
                    other.stop_reason = "gang"
                    other.stop_signal = job.spec.get("checkpoint_signal", "SIGTERM")
                    other.stop_grace_s = float(job.spec.get("grace_period_s", 30.0))
        return
    if job.restart_count != a.attempt:
        return  # a late report about an older attempt
    outcome, code, sig = attempt_outcome(attempt)
    reason = rep.reason or f"attempt ended: {outcome.value}"
    finish_job(s, job, outcome, now, reason=reason, exit_code=code, signal=sig)


def _apply_replica(s: Session, node: str, rep: ReplicaStatus, now: float) -> str | None:
    """Apply one report; returns the id when the assignment is finished (to acknowledge)."""
    a = s.get(AssignmentModel, rep.assignment_id)
    if a is None or a.node != node:
        return None  # unknown to us: ignore (rule 3)
    if a.state == "finished":
        return a.id
    if rep.isolation is not None and rep.isolation != a.isolation:
        a.isolation = rep.isolation
        # A mode can be known only once the job runs (shim: a process attached) or change
        # while it runs (it escaped the shim, lost MPS): the job's record follows.
        job = s.get(JobModel, a.job_id)
        if job is not None and job.state == JobState.RUNNING.value:
            job.isolation = rep.isolation if rep.isolation in _ISOLATIONS else None
    if rep.state in (ReplicaState.EXITED, ReplicaState.BOOT_FAILED):
        job = s.get(JobModel, a.job_id)
        if job is not None and job.isolation is None and a.isolation in _ISOLATIONS:
            job.isolation = a.isolation  # it ended before it was seen running: still say how
        _finish_assignment(s, a, rep, now)
        return a.id
    if rep.state is ReplicaState.RUNNING and a.state == "dispatched":
        a.state = "running"
        a.started_at = now
        job = s.get(JobModel, a.job_id)
        if job is not None and job.state == JobState.CONFIGURING.value:
            move(s, job, JobState.RUNNING, now, reason=f"running on {node}")
            job.isolation = rep.isolation if rep.isolation in _ISOLATIONS else None
    if rep.isolation_reason and rep.state is ReplicaState.RUNNING:
        job = s.get(JobModel, a.job_id)  # shown while it runs (gpupool show, the job's view)
        if job is not None and job.state == JobState.RUNNING.value:
            job.reason = rep.isolation_reason
    if rep.spilled_bytes:
        record_spilled(s, a.id, rep.spilled_bytes)
    if rep.checkpoint_time is not None:
        job = s.get(JobModel, a.job_id)
        if job is not None:
            job.last_checkpoint_time = rep.checkpoint_time
    return None


def _assignment_spec(s: Session, a: AssignmentModel, epoch: int) -> AssignmentSpec | None:
    job = s.get(JobModel, a.job_id)
    if job is None:
        return None
    spec = job.spec
    slices = list(
        s.scalars(
            select(SliceModel).where(SliceModel.assignment_id == a.id).order_by(SliceModel.id)
        )
    )
    gang = None
    if spec["replicas"] > 1:
        leader = s.scalar(
            select(AssignmentModel).where(
                AssignmentModel.job_id == a.job_id,
                AssignmentModel.attempt == a.attempt,
                AssignmentModel.rank == 0,
            )
        )
        leader_node = s.get(NodeModel, leader.node) if leader is not None else None
        local_rank = len(
            list(
                s.scalars(
                    select(AssignmentModel.id).where(
                        AssignmentModel.job_id == a.job_id,
                        AssignmentModel.attempt == a.attempt,
                        AssignmentModel.node == a.node,
                        AssignmentModel.rank < a.rank,
                    )
                )
            )
        )
        gang = GangInfo(
            master_addr=(leader_node.address or leader_node.name) if leader_node else a.node,
            master_port=(leader.master_port if leader and leader.master_port else 29500),
            world_size=spec["replicas"],
            rank=a.rank,
            local_rank=local_rank,
        )
    return AssignmentSpec(
        assignment_id=a.id,
        epoch=epoch,
        job_id=job.id,
        job_name=job.name,
        user=job.user,
        replica_rank=a.rank,
        command=list(spec["command"]),
        script=spec["script"],
        env=dict(spec["env"]),
        workdir=spec["workdir"],
        workdir_upload=spec.get("workdir_upload"),
        device_uuids=[sl.device_uuid for sl in slices],
        milli_per_device=slices[0].milli if slices else 0,
        memory_mib_per_device=slices[0].memory_mib if slices else 0,
        isolation=spec["isolation"],
        memory_oversubscription=oversubscription_of(s, job.pool),
        time_limit_s=spec["time_limit_s"],
        checkpoint_signal=spec["checkpoint_signal"],
        grace_period_s=spec["grace_period_s"],
        gang=gang,
        restart_count=job.restart_count,
        checkpoint_dir=None,
        priority=job.priority,
        preemptible=spec["preemptible"],
        array=ArrayInfo(**spec["array"]) if spec.get("array") else None,
    )


def _stale_agent(req: HeartbeatRequest, epoch: int, interval_s: float) -> HeartbeatResponse:
    """The answer to an agent that no longer speaks for its node: another agent registered the
    name while this one was away past the node timeout, so the server has ended this one's
    replicas (failed over as NODE_FAIL). Nothing it reports is recorded. While it still runs
    replicas it is told to kill them (never two copies of a job at once); then it is told to
    register again, which is refused while the other agent lives, with what to do."""
    alive = [
        r.assignment_id
        for r in req.replicas
        if r.state in (ReplicaState.STARTING, ReplicaState.RUNNING)
    ]
    stop = _kill_at_once(alive, epoch)
    return HeartbeatResponse(
        epoch=epoch, heartbeat_interval_s=interval_s, stop=stop, registered=bool(alive)
    )


class HeartbeatService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def heartbeat(self, actor: Actor, req: HeartbeatRequest) -> HeartbeatResponse:
        require(actor.principal, Permission.AGENT)
        now = self.cp.now()
        settings = self.cp.settings
        changed = False
        with self.cp.tx() as s:
            epoch = current_epoch(s)
            node = s.get(NodeModel, req.node)
            if (
                node is not None
                and req.agent_id is not None
                and node.agent_id is not None
                and req.agent_id != node.agent_id
            ):
                return _stale_agent(req, epoch, settings.heartbeat_interval_s)
            if node is None:
                return HeartbeatResponse(
                    epoch=epoch,
                    heartbeat_interval_s=settings.heartbeat_interval_s,
                    node_timeout_s=settings.node_timeout_s,
                    registered=False,
                )
            node.last_heartbeat = now
            if node.state == NodeState.DOWN.value:
                node.state = NodeState.UP.value
                changed = True
            apply_telemetry(s, req.node, req.telemetry, now, settings.temperature_alert_c)
            finished: list[str] = []
            orphans: list[str] = []  # still running here, but the server ended them
            for rep in req.replicas:
                done = _apply_replica(s, req.node, rep, now)
                if done is None:
                    continue
                changed = True
                if rep.state in (ReplicaState.STARTING, ReplicaState.RUNNING):
                    orphans.append(done)
                else:
                    finished.append(done)
            live = list(
                s.scalars(
                    select(AssignmentModel).where(
                        AssignmentModel.node == req.node, AssignmentModel.state != "finished"
                    )
                )
            )
            accrue(
                s,
                list(
                    s.scalars(
                        select(SliceModel).where(
                            SliceModel.assignment_id.in_([a.id for a in live]),
                            SliceModel.active.is_(True),
                        )
                    )
                ),
                now,
            )
            reported = {r.assignment_id for r in req.replicas}
            start: list[AssignmentSpec] = []
            # A replica the server already ended (its node was declared down, and the job was
            # failed over) must not keep running beside its replacement: stop it at once.
            stop = _kill_at_once(orphans, epoch)
            for a in live:
                wire = WIRE_STOP_REASON.get(a.stop_reason or "")
                if wire is not None and a.state == "dispatched" and a.id not in reported:
                    # Stopped (cancelled, preempted...) before this node reported it: it never
                    # started there, so end it here and free its slices. Were it to start after
                    # all, the orphan rule above would stop it at once.
                    unstarted = ReplicaStatus(
                        assignment_id=a.id,
                        state=ReplicaState.EXITED,
                        reason="stopped before it started",
                    )
                    _finish_assignment(s, a, unstarted, now)
                    changed = True
                    continue
                if wire is not None:
                    stop.append(
                        StopOrder(
                            assignment_id=a.id,
                            epoch=epoch,
                            reason=wire,
                            signal=a.stop_signal or "SIGTERM",
                            grace_period_s=a.stop_grace_s or 0.0,
                        )
                    )
                elif a.state == "dispatched" and a.id not in reported:
                    spec = _assignment_spec(s, a, epoch)
                    if spec is not None:
                        start.append(spec)
            resize = resize_orders(s, live, epoch)
        if changed:
            self.cp.poke()
        return HeartbeatResponse(
            epoch=epoch,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            node_timeout_s=settings.node_timeout_s,
            start=start,
            stop=stop,
            resize=resize,
            finished_ack=finished,
        )
