"""Resizing a running slice in place (``gpupool resize JOB --gpu-mem 30GiB -g 0.5``).

Only a running job under isolation ``shim`` can be resized: the CUDA shim reads its limits from
the replica's region on every allocation and launch, so the agent changes them there and the
job's processes see the new slice at once (a memory limit below current usage takes nothing
back; new allocations are refused until usage falls under it).

Admitted like any other change of what a job holds: each of the job's devices must have room
for the new share beside everyone else's (compute at most a whole device, memory at most the
device's promisable memory: physical times its pool's ``memory_overcommit``), and the tenant's
quota in the pool (``limit_milli``, ``limit_memory_mib``) must hold with the new sizes. The
change is audited (``job.resize``), written as an event (``GET /v1/events``, kind
``job.resize``), and reaches the agent through the heartbeat answer (``HeartbeatResponse
.resize``, announced to the node's long poll). The job's spec is not changed: a requeued job
starts again with the slice it asked for.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Invalid
from gpupool.control.machinery.orders import mark
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor
from gpupool.control.services.jobs import JobService
from gpupool.control.services.jobviews import JobDetail, load_details
from gpupool.domain.assignments import AssignmentState
from gpupool.domain.states import JobState
from gpupool.domain.units import MILLI_PER_GPU, format_gpus, format_memory
from gpupool.schemas.agent import ResizeOrder
from gpupool.store.models import (
    AssignmentModel,
    DeviceModel,
    EventModel,
    JobModel,
    PoolModel,
    QuotaModel,
    SliceModel,
)


class ResizeService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._jobs = JobService(cp)

    def resize(
        self, actor: Actor, job_id: str, *, milli: int | None, memory_mib: int | None
    ) -> JobDetail:
        """Give every slice of a running shim job ``milli`` and/or ``memory_mib`` per device."""
        if milli is None and memory_mib is None:
            raise Invalid("say what to resize: --gpu-mem SIZE and/or -g GPUS")
        if milli is not None and not 1 <= milli <= MILLI_PER_GPU:
            raise Invalid(
                f"a slice under isolation shim is 0.001 to 1 of a device, not {format_gpus(milli)}"
            )
        if memory_mib is not None and memory_mib < 1:
            raise Invalid("a slice needs at least 1MiB of GPU memory")
        now = self.cp.now()
        with self.cp.tx() as s:
            row = self._jobs._load_for_change(s, actor.principal, job_id)
            if row.state != JobState.RUNNING.value or row.isolation != "shim":
                raise Conflict(
                    f"job {job_id} is {row.state} under isolation {row.isolation or 'none yet'}: "
                    "only a running job under isolation shim can be resized (submit with "
                    "--isolation shim; `gpupool show JOB` says which it got)"
                )
            mine = _active_slices(s, job_id)
            if not mine:
                raise Conflict(f"job {job_id} holds no GPU slice to resize")
            for sl in mine:
                _check_device(s, sl, milli, memory_mib)
            _check_quota(s, row, mine, milli, memory_mib)
            old = f"{format_gpus(mine[0].milli)} GPU, {format_memory(mine[0].memory_mib)}"
            for sl in mine:
                if milli is not None:
                    sl.milli = milli
                if memory_mib is not None:
                    sl.memory_mib = memory_mib
            new = f"{format_gpus(mine[0].milli)} GPU, {format_memory(mine[0].memory_mib)}"
            message = (
                f"job {job_id} resized from {old} to {new} per device by {actor.principal.user}"
            )
            s.add(EventModel(time=now, kind="job.resize", subject=job_id, message=message))
            audit.record(s, actor, "job.resize", now, target=job_id)
            nodes = set(
                s.scalars(
                    select(AssignmentModel.node).where(
                        AssignmentModel.id.in_({sl.assignment_id for sl in mine})
                    )
                )
            )
            mark(s, nodes)  # the agents' long polls wake and fetch the new sizes
            s.flush()
            detail = load_details(s, [row])[0]
        self.cp.poke()
        return detail


def _active_slices(s: Session, job_id: str) -> list[SliceModel]:
    live = select(AssignmentModel.id).where(
        AssignmentModel.job_id == job_id, AssignmentModel.state != AssignmentState.FINISHED.value
    )
    return list(
        s.scalars(
            select(SliceModel)
            .where(SliceModel.assignment_id.in_(live), SliceModel.active.is_(True))
            .order_by(SliceModel.id)
        )
    )


def _check_device(s: Session, sl: SliceModel, milli: int | None, memory_mib: int | None) -> None:
    dev = s.get(DeviceModel, sl.device_uuid)
    if dev is None:
        raise Conflict(f"device {sl.device_uuid} of the job is no longer registered")
    others_milli, others_mem = s.execute(
        select(
            func.coalesce(func.sum(SliceModel.milli), 0),
            func.coalesce(func.sum(SliceModel.memory_mib), 0),
        ).where(
            SliceModel.device_uuid == sl.device_uuid,
            SliceModel.active.is_(True),
            SliceModel.id != sl.id,
        )
    ).one()
    if milli is not None and int(others_milli) + milli > MILLI_PER_GPU:
        free = MILLI_PER_GPU - int(others_milli)
        raise Conflict(
            f"device {sl.device_uuid} has {format_gpus(free)} GPU free beside its other "
            f"slices, not {format_gpus(milli)}: ask for at most that"
        )
    if memory_mib is not None:
        pool = s.get(PoolModel, dev.pool)
        promisable = int(dev.memory_mib * (pool.memory_overcommit if pool else 1.0))
        free = promisable - int(others_mem)
        if memory_mib > free:
            raise Conflict(
                f"device {sl.device_uuid} has {format_memory(max(0, free))} of GPU memory free "
                f"beside its other slices, not {format_memory(memory_mib)}: ask for at most that"
            )


def _check_quota(
    s: Session,
    job: JobModel,
    mine: list[SliceModel],
    milli: int | None,
    memory_mib: int | None,
) -> None:
    quota = s.get(QuotaModel, (job.tenant, job.pool))
    if quota is None:
        return
    held_milli, held_mem = s.execute(
        select(
            func.coalesce(func.sum(SliceModel.milli), 0),
            func.coalesce(func.sum(SliceModel.memory_mib), 0),
        )
        .join(JobModel, JobModel.id == SliceModel.job_id)
        .where(
            SliceModel.active.is_(True), JobModel.tenant == job.tenant, JobModel.pool == job.pool
        )
    ).one()
    new_milli = int(held_milli) + sum((milli - sl.milli) for sl in mine if milli is not None)
    new_mem = int(held_mem) + sum(
        (memory_mib - sl.memory_mib) for sl in mine if memory_mib is not None
    )
    if quota.limit_milli is not None and milli is not None and new_milli > quota.limit_milli:
        raise Conflict(
            f"tenant {job.tenant} would hold {format_gpus(new_milli)} GPUs in pool {job.pool}, "
            f"over its quota of {format_gpus(quota.limit_milli)}: ask for less"
        )
    if (
        quota.limit_memory_mib is not None
        and memory_mib is not None
        and new_mem > quota.limit_memory_mib
    ):
        raise Conflict(
            f"tenant {job.tenant} would hold {format_memory(new_mem)} of GPU memory in pool "
            f"{job.pool}, over its quota of {format_memory(quota.limit_memory_mib)}: ask for less"
        )


def resize_orders(s: Session, live: list[AssignmentModel], epoch: int) -> list[ResizeOrder]:
    """The current slice of every running shim replica among ``live`` (one node's), for the
    heartbeat answer: level-triggered, so a lost answer or a restarted agent still converges."""
    shim = {
        a.id: a for a in live if a.state == AssignmentState.RUNNING.value and a.isolation == "shim"
    }
    if not shim:
        return []
    first: dict[str, SliceModel] = {}
    for sl in s.scalars(
        select(SliceModel)
        .where(SliceModel.assignment_id.in_(list(shim)), SliceModel.active.is_(True))
        .order_by(SliceModel.id)
    ):
        first.setdefault(sl.assignment_id, sl)
    return [
        ResizeOrder(
            assignment_id=aid,
            epoch=epoch,
            milli_per_device=max(1, min(MILLI_PER_GPU, sl.milli)),
            memory_mib_per_device=max(1, sl.memory_mib),
        )
        for aid, sl in sorted(first.items())
    ]
