"""Handling an agent's heartbeat: telemetry, alerts, replica states, and what to send back.

One heartbeat is one transaction, applied as named steps (:class:`_Beat`): the node returns
(heard from, up again if it was down); telemetry (device health and samples, alerts); replica
reports (each reported state applied to its assignment and job, an ended replica through
:func:`~gpupool.control.machinery.lifecycle.end_assignments`; replicas the server already
ended are the **orphans**, killed at once); unstarted ends (replicas stopped before this node
reported them end now); usage (accrued up to now); and the answer (starts, stops and resizes
from :mod:`gpupool.control.machinery.nodeorders`, finished assignments the agent may forget).
See :mod:`gpupool.schemas.agent` for the protocol's rules.

Alerts: a device reaching ``temperature_alert_c``, or reporting itself unhealthy or an XID
error, writes an ``alert.temperature`` / ``alert.health`` event and a log line when it crosses
the threshold (not on every sample); the metric ``gpupool_alerts`` shows alerts in force.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.jobstate import move
from gpupool.control.machinery.lifecycle import Ending, end_assignments, move_assignment
from gpupool.control.machinery.nodeorders import kill_at_once, node_orders, wire_reason
from gpupool.control.services.accounting import accrue
from gpupool.control.services.auth import Actor, require
from gpupool.control.services.nodes import current_epoch
from gpupool.control.services.oversubscription import record_spilled
from gpupool.control.services.resize import resize_orders
from gpupool.control.settings import ServerSettings
from gpupool.domain.assignments import AssignmentState, StopReason
from gpupool.domain.nodes import DeviceHealth, NodeState
from gpupool.domain.states import JobState
from gpupool.domain.users import Permission
from gpupool.schemas.agent import (
    DeviceTelemetry,
    HeartbeatRequest,
    HeartbeatResponse,
    ReplicaState,
    ReplicaStatus,
)
from gpupool.store.models import (
    AssignmentModel,
    DeviceModel,
    EventModel,
    JobEventModel,
    JobModel,
    NodeModel,
    SliceModel,
)

log = logging.getLogger("gpupool.control.alerts")

#: Isolation modes a job's record may say it got (anything else is not recorded).
_ISOLATIONS = ("exclusive", "mps", "soft", "mig", "shim", "mps+shim")


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


def _ending(rep: ReplicaStatus) -> Ending:
    """What an agent's report of an ended replica says about how it ended."""
    if rep.state is ReplicaState.BOOT_FAILED:
        reason: StopReason | None = StopReason.BOOT
    elif rep.stop_reason is not None:
        reason = StopReason.parse(rep.stop_reason.value)
    else:
        reason = None
    return Ending(rep.exit_code, rep.signal, reason, rep.reason, final=rep.final)


def _apply_replica(s: Session, node: str, rep: ReplicaStatus, now: float) -> str | None:
    """Apply one report; returns the id when the assignment is finished (to acknowledge)."""
    a = s.get(AssignmentModel, rep.assignment_id)
    if a is None or a.node != node:
        return None  # unknown to us: ignore (rule 3)
    if a.state == AssignmentState.FINISHED.value:
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
        end_assignments(s, [(a, _ending(rep))], now)
        return a.id
    if rep.state is ReplicaState.RUNNING and a.state == AssignmentState.DISPATCHED.value:
        move_assignment(a, AssignmentState.RUNNING, now)
        job = s.get(JobModel, a.job_id)
        if job is not None and job.state == JobState.CONFIGURING.value:
            move(s, job, JobState.RUNNING, now, reason=f"running on {node}")
            job.isolation = rep.isolation if rep.isolation in _ISOLATIONS else None
    if rep.reason and rep.state is ReplicaState.STARTING:
        _record_progress(s, a.job_id, rep.reason, now)
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


def _record_progress(s: Session, job_id: str, progress: str, now: float) -> None:
    """A starting replica's progress (its container image's pull) as a job event and the
    job's reason, once per new line."""
    job = s.get(JobModel, job_id)
    if job is None or job.state != JobState.CONFIGURING.value or job.reason == progress:
        return
    job.reason = progress
    state = JobState.CONFIGURING.value
    s.add(JobEventModel(job_id=job_id, time=now, source=state, target=state,
                        version=job.version, reason=progress))  # fmt: skip


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
    stop = kill_at_once(alive, epoch)
    return HeartbeatResponse(
        epoch=epoch, heartbeat_interval_s=interval_s, stop=stop, registered=bool(alive)
    )


@dataclass
class _Beat:
    """One heartbeat being applied: its transaction, what it reported, what it changed.

    ``finished``: ended assignments it reported (acknowledged in the answer); ``orphans``:
    assignments it reports alive that the server already ended (killed at once); ``changed``:
    something the scheduler should look at again (a node back, a replica ended)."""

    s: Session
    req: HeartbeatRequest
    now: float
    epoch: int
    finished: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    changed: bool = False

    def node_returns(self, node: NodeModel) -> None:
        """Step: the node is heard from; a node marked down is up again."""
        node.last_heartbeat = self.now
        if node.state == NodeState.DOWN.value:
            node.state = NodeState.UP.value
            self.changed = True

    def replica_reports(self) -> None:
        """Step: apply each reported replica state to its assignment and job."""
        for rep in self.req.replicas:
            done = _apply_replica(self.s, self.req.node, rep, self.now)
            if done is None:
                continue
            self.changed = True
            if rep.state in (ReplicaState.STARTING, ReplicaState.RUNNING):
                # still running here, but the server ended it (its node was declared down and
                # the job failed over): it must not run beside its replacement
                self.orphans.append(done)
            else:
                self.finished.append(done)

    def live(self) -> list[AssignmentModel]:
        return list(
            self.s.scalars(
                select(AssignmentModel).where(
                    AssignmentModel.node == self.req.node,
                    AssignmentModel.state != AssignmentState.FINISHED.value,
                )
            )
        )

    def unstarted_ends(self, live: list[AssignmentModel]) -> list[AssignmentModel]:
        """Step: end the assignments stopped (cancelled, preempted...) before this node
        reported them: they never started here, so their slices are freed now. Were one to
        start after all, the orphan rule would stop it at once. Returns those still live."""
        reported = {r.assignment_id for r in self.req.replicas}
        unstarted = [
            a
            for a in live
            if wire_reason(a.stop_reason) is not None
            and a.state == AssignmentState.DISPATCHED.value
            and a.id not in reported
        ]
        if unstarted:
            ending = Ending(message="stopped before it started")
            end_assignments(self.s, [(a, ending) for a in unstarted], self.now)
            self.changed = True
        gone = {a.id for a in unstarted}
        return [a for a in live if a.id not in gone]

    def usage(self, live: list[AssignmentModel]) -> None:
        """Step: accrue the usage of the node's live slices up to now."""
        accrue(
            self.s,
            list(
                self.s.scalars(
                    select(SliceModel).where(
                        SliceModel.assignment_id.in_([a.id for a in live]),
                        SliceModel.active.is_(True),
                    )
                )
            ),
            self.now,
        )

    def settles(self, answer: HeartbeatResponse, hot_c: float) -> bool:
        """Whether the node's next heartbeats, if they report the same, may be answered from
        memory (see :mod:`~gpupool.control.machinery.settled`): nothing changed, nothing to
        start, stop or acknowledge, no device near an alert."""
        return not (
            self.changed
            or answer.start
            or answer.stop
            or answer.finished_ack
            or not answer.registered
            or any(not t.healthy or t.xid is not None for t in self.req.telemetry)
            or any(
                t.temperature_c is not None and t.temperature_c >= hot_c for t in self.req.telemetry
            )
        )

    def answer(self, live: list[AssignmentModel], settings: ServerSettings) -> HeartbeatResponse:
        """Step: what the node should do now (see :mod:`~.machinery.nodeorders`)."""
        reported = {r.assignment_id for r in self.req.replicas}
        start, stop = node_orders(self.s, live, reported, self.epoch)
        return HeartbeatResponse(
            epoch=self.epoch,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            node_timeout_s=settings.node_timeout_s,
            start=start,
            stop=kill_at_once(self.orphans, self.epoch) + stop,
            resize=resize_orders(self.s, live, self.epoch),
            finished_ack=self.finished,
        )


class HeartbeatService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def quietly(self, actor: Actor, req: HeartbeatRequest) -> HeartbeatResponse | None:
        """The answer when ``req`` is quiet or a delta whose base is not held here (no
        transaction, no thread needed: the API calls this on its event loop), else ``None``:
        then call :meth:`heartbeat`."""
        require(actor.principal, Permission.AGENT)
        full = self.cp.reports.expand(req)
        if full is None:
            return self._want_full(req)
        return self._quiet(full, self.cp.orders.seq(req.node))

    def _want_full(self, req: HeartbeatRequest) -> HeartbeatResponse:
        # The node is talking (its token checked), only its base is not held here (it moved
        # from another replica, or this server restarted): it counts as heard, or a node
        # whose full heartbeats are then shed by a busy server would be judged silent.
        self.cp.admission.heard(req.node, self.cp.now())
        settings = self.cp.settings
        return HeartbeatResponse(
            epoch=0,  # nothing in this answer is acted on
            heartbeat_interval_s=settings.heartbeat_interval_s,
            node_timeout_s=settings.node_timeout_s,
            ack_seq=req.seq,
            want_full=True,
        )

    def _quiet(self, req: HeartbeatRequest, order_seq: int) -> HeartbeatResponse | None:
        quiet = self.cp.settled.answer(req, order_seq, self.cp.settings.temperature_alert_c)
        if quiet is None:
            return None
        self.cp.admission.heard(req.node, self.cp.now())  # written with the others
        self.cp.reports.applied(req, quiet.answer)
        if req.seq is None:
            return quiet.answer
        return quiet.answer.model_copy(update={"ack_seq": req.seq})

    def heartbeat(self, actor: Actor, req: HeartbeatRequest) -> HeartbeatResponse:
        """Answer a quiet heartbeat from memory (:mod:`~.machinery.settled`), else apply it in
        one transaction, step by step, and answer it."""
        require(actor.principal, Permission.AGENT)
        settings = self.cp.settings
        full = self.cp.reports.expand(req)  # a delta as the full state (reportbook.py)
        if full is None:
            return self._want_full(req)
        req = full
        order_seq = self.cp.orders.seq(req.node)  # before the transaction: see settled.py
        quiet = self._quiet(req, order_seq)
        if quiet is not None:
            return quiet
        version = 0
        with self.cp.tx() as s:
            beat = _Beat(s, req, self.cp.now(), current_epoch(s))
            node = s.get(NodeModel, req.node)
            if node is None:
                return HeartbeatResponse(
                    epoch=beat.epoch,
                    heartbeat_interval_s=settings.heartbeat_interval_s,
                    node_timeout_s=settings.node_timeout_s,
                    registered=False,
                )
            if req.agent_id is not None and node.agent_id not in (None, req.agent_id):
                return _stale_agent(req, beat.epoch, settings.heartbeat_interval_s)
            beat.node_returns(node)
            apply_telemetry(s, req.node, req.telemetry, beat.now, settings.temperature_alert_c)
            beat.replica_reports()
            live = beat.unstarted_ends(beat.live())
            beat.usage(live)
            answer = beat.answer(live, settings)
            version = node.orders_version
        if beat.changed:
            self.cp.poke()
        if beat.settles(answer, settings.temperature_alert_c):
            self.cp.settled.settle(req, order_seq, version, answer)
        else:
            self.cp.settled.forget(req.node)
        self.cp.reports.applied(req, answer)
        if req.seq is None:
            return answer
        return answer.model_copy(update={"ack_seq": req.seq})
