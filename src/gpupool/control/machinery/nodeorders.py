"""What a node should start and stop, computed in one place from typed values.

The heartbeat answer (:mod:`gpupool.control.services.heartbeat`) is built from here:

- a **start order** (:class:`~gpupool.schemas.agent.AssignmentSpec`) for an assignment placed
  on the node that its agent has not reported yet, from the job's spec read once through
  :func:`stored_job` (not the raw JSON), its slices and, for a gang, the rendezvous;
- a **stop order** (:class:`~gpupool.schemas.agent.StopOrder`) for a live assignment with a stop
  reason, with the signal and grace the reason was ordered with (the job's
  :class:`~gpupool.domain.assignments.StopPolicy` at the time);
- an **at-once kill** for replicas that must not run a moment longer.

Words:

- **stored job**: a job row read as typed values: its :class:`~gpupool.domain.jobs.Job` (spec
  included) and what the store keeps beside the spec (``workdir_upload``). The one reader of a
  stored spec outside the scheduling snapshot, which has its own cache of parsed specs.
- **wire reason**: the agent protocol's :class:`~gpupool.schemas.agent.StopReason`; the server's
  reasons map to it through :data:`WIRE_STOP_REASON` and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control.services.oversubscription import container_engine_of, oversubscription_of
from gpupool.domain.assignments import KILL_AT_ONCE, AssignmentState, StopPolicy, StopReason
from gpupool.domain.jobs import Job
from gpupool.schemas.agent import ArrayInfo, AssignmentSpec, GangInfo, PtyWire, StopOrder
from gpupool.schemas.agent import StopReason as WireStopReason
from gpupool.schemas.containers import container_wire
from gpupool.store.mapping import job_from_row
from gpupool.store.models import AssignmentModel, JobModel, NodeModel, SliceModel

#: How the server's stop orders travel on the wire (``gang``: a sibling replica ended, so this
#: one is cancelled). Reasons not listed are never orders: the agent reports them, or the
#: server records them on an assignment it ended itself (``node``, ``boot``).
WIRE_STOP_REASON: dict[StopReason, WireStopReason] = {
    StopReason.CANCEL: WireStopReason.CANCEL,
    StopReason.PREEMPT: WireStopReason.PREEMPT,
    StopReason.TIMEOUT: WireStopReason.TIMEOUT,
    StopReason.GANG: WireStopReason.CANCEL,
}

#: The rendezvous port when rank 0's assignment names none (an assignment from an old server).
DEFAULT_MASTER_PORT = 29500


def wire_reason(stop_reason: str | None) -> WireStopReason | None:
    """The wire reason of a stored stop reason, or ``None`` when it is no order to send."""
    if stop_reason is None:
        return None
    return WIRE_STOP_REASON.get(StopReason.parse(stop_reason))


@dataclass(frozen=True)
class StoredJob:
    """A job row as typed values (see the module docstring)."""

    job: Job
    workdir_upload: str | None = None

    @property
    def stop_policy(self) -> StopPolicy:
        return StopPolicy.of(self.job.spec)


def stored_job(row: JobModel) -> StoredJob:
    """Read a job row once into typed values."""
    upload = row.spec.get("workdir_upload") if row.spec else None
    return StoredJob(job_from_row(row), str(upload) if upload else None)


def kill_at_once(assignment_ids: Iterable[str], epoch: int) -> list[StopOrder]:
    """Stop orders for replicas that must not run a moment longer (SIGKILL, no grace)."""
    return [
        StopOrder(
            assignment_id=aid,
            epoch=epoch,
            reason=WireStopReason.CANCEL,
            signal=KILL_AT_ONCE.signal,
            grace_period_s=KILL_AT_ONCE.grace_s,
        )
        for aid in assignment_ids
    ]


def stop_order(a: AssignmentModel, epoch: int) -> StopOrder | None:
    """The stop order in force for a live assignment, or ``None`` when it has none."""
    wire = wire_reason(a.stop_reason)
    if wire is None:
        return None
    return StopOrder(
        assignment_id=a.id,
        epoch=epoch,
        reason=wire,
        signal=a.stop_signal or "SIGTERM",
        grace_period_s=a.stop_grace_s or 0.0,
    )


def _gang(s: Session, a: AssignmentModel, world_size: int) -> GangInfo:
    """Rendezvous for replica ``a``: rank 0's node and port; its rank among the replicas of the
    same attempt on its own node."""
    leader = s.scalar(
        select(AssignmentModel).where(
            AssignmentModel.job_id == a.job_id,
            AssignmentModel.attempt == a.attempt,
            AssignmentModel.rank == 0,
        )
    )
    leader_node = s.get(NodeModel, leader.node) if leader is not None else None
    local_rank = s.scalar(
        select(func.count(AssignmentModel.id)).where(
            AssignmentModel.job_id == a.job_id,
            AssignmentModel.attempt == a.attempt,
            AssignmentModel.node == a.node,
            AssignmentModel.rank < a.rank,
        )
    )
    return GangInfo(
        master_addr=(leader_node.address or leader_node.name) if leader_node else a.node,
        master_port=(leader.master_port if leader and leader.master_port else DEFAULT_MASTER_PORT),
        world_size=world_size,
        rank=a.rank,
        local_rank=int(local_rank or 0),
    )


def start_order(s: Session, a: AssignmentModel, epoch: int) -> AssignmentSpec | None:
    """What the node must start for assignment ``a`` (``None``: its job is gone)."""
    row = s.get(JobModel, a.job_id)
    if row is None:
        return None
    stored = stored_job(row)
    job, spec = stored.job, stored.job.spec
    slices = list(
        s.scalars(
            select(SliceModel).where(SliceModel.assignment_id == a.id).order_by(SliceModel.id)
        )
    )
    array = job.array
    return AssignmentSpec(
        assignment_id=a.id,
        epoch=epoch,
        job_id=job.id,
        job_name=spec.name,
        user=job.user,
        replica_rank=a.rank,
        command=list(spec.command),
        script=spec.script,
        env=dict(spec.env),
        workdir=spec.workdir,
        workdir_upload=stored.workdir_upload,
        device_uuids=[sl.device_uuid for sl in slices],
        milli_per_device=slices[0].milli if slices else 0,
        memory_mib_per_device=slices[0].memory_mib if slices else 0,
        isolation=spec.isolation.value,
        memory_oversubscription=oversubscription_of(s, spec.pool),
        time_limit_s=spec.time_limit_s,
        checkpoint_signal=stored.stop_policy.signal,
        grace_period_s=stored.stop_policy.grace_s,
        gang=_gang(s, a, spec.replicas) if spec.is_gang else None,
        restart_count=job.restart_count,
        checkpoint_dir=None,
        priority=job.priority,
        preemptible=spec.preemptible,
        array=(
            ArrayInfo(
                array_id=array.array_id,
                index=array.index,
                count=array.count,
                first=array.first,
                last=array.last,
            )
            if array is not None
            else None
        ),
        container=container_wire(spec.container, default_engine=container_engine_of(s, spec.pool)),
        pty=PtyWire(**spec.pty.to_json()) if spec.pty is not None else None,
        stdout_path=spec.stdout_path,
        stderr_path=spec.stderr_path,
    )


def node_orders(
    s: Session, live: Iterable[AssignmentModel], reported: set[str], epoch: int
) -> tuple[list[AssignmentSpec], list[StopOrder]]:
    """The starts and stops in force for a node's ``live`` assignments: a stop for every one
    with a stop order; a start for every dispatched one its agent did not report."""
    start: list[AssignmentSpec] = []
    stop: list[StopOrder] = []
    for a in live:
        order = stop_order(a, epoch)
        if order is not None:
            stop.append(order)
        elif a.state == AssignmentState.DISPATCHED.value and a.id not in reported:
            spec = start_order(s, a, epoch)
            if spec is not None:
                start.append(spec)
    return start, stop
