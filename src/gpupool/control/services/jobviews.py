"""What a read of jobs answers: :class:`JobDetail` (a job with its pending reason, estimated
start, nodes and slices), :class:`JobFilter` and :class:`JobPage` for listing, and
:func:`load_details`, which reads the details of many jobs in a few queries.

Used by the job service's reads (:mod:`gpupool.control.services.jobs`) and by
:mod:`gpupool.control.services.resize`, which answers with a job's detail too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.domain.assignments import AssignmentState
from gpupool.domain.jobs import Job
from gpupool.domain.states import JobState
from gpupool.store.mapping import job_from_row
from gpupool.store.models import AssignmentModel, JobModel, PoolModel, SliceModel


@dataclass(frozen=True)
class JobDetail:
    """A job with what the scheduler last said about it and where its replicas run."""

    job: Job
    pending_reason: str | None = None
    estimated_start: float | None = None
    nodes: tuple[str, ...] = ()
    assignments: tuple[str, ...] = ()
    slices: tuple[JobSlice, ...] = ()
    memory_oversubscription: str = "fail"  # its pool's choice (isolation shim)


@dataclass(frozen=True)
class JobSlice:
    """A share of one device held by one replica of a job (``milli`` milli-GPU, MiB)."""

    replica: int
    node: str
    device_uuid: str
    milli: int
    memory_mib: int
    spilled_bytes: int = 0  # held in host memory (isolation shim, pool spill), as last reported


@dataclass(frozen=True)
class JobFilter:
    states: tuple[JobState, ...] = ()
    tenant: str | None = None
    user: str | None = None
    pool: str | None = None
    name: str | None = None
    array_id: str | None = None  # the tasks of one job array


@dataclass(frozen=True)
class JobPage:
    """One page of jobs; ``details`` holds each job's detail (same order as ``jobs``)."""

    jobs: list[Job] = field(default_factory=list)
    next_cursor: str | None = None
    details: list[JobDetail] = field(default_factory=list)


def load_details(s: Session, rows: list[JobModel]) -> list[JobDetail]:
    """Details of many jobs in two queries: live assignments and their active slices."""
    ids = [r.id for r in rows]
    live: dict[str, list[AssignmentModel]] = {}
    slices: dict[str, list[JobSlice]] = {}
    if ids:
        by_id: dict[str, AssignmentModel] = {}
        for a in s.scalars(
            select(AssignmentModel)
            .where(
                AssignmentModel.job_id.in_(ids),
                AssignmentModel.state != AssignmentState.FINISHED.value,
            )
            .order_by(AssignmentModel.rank)
        ):
            live.setdefault(a.job_id, []).append(a)
            by_id[a.id] = a
        if by_id:
            for sl in s.scalars(
                select(SliceModel)
                .where(SliceModel.assignment_id.in_(list(by_id)), SliceModel.active.is_(True))
                .order_by(SliceModel.id)
            ):
                a = by_id[sl.assignment_id]
                slices.setdefault(a.job_id, []).append(
                    JobSlice(
                        a.rank, a.node, sl.device_uuid, sl.milli, sl.memory_mib, sl.spilled_bytes
                    )
                )
    spill = {
        p.name: p.memory_oversubscription
        for p in (
            s.scalars(select(PoolModel).where(PoolModel.name.in_({r.pool for r in rows})))
            if rows
            else ()
        )
    }
    out = []
    for row in rows:
        mine = live.get(row.id, [])
        out.append(
            JobDetail(
                job=job_from_row(row),
                pending_reason=row.pending_reason,
                estimated_start=row.estimated_start,
                nodes=tuple(a.node for a in mine),
                assignments=tuple(a.id for a in mine),
                slices=tuple(sorted(slices.get(row.id, []), key=lambda x: x.replica)),
                memory_oversubscription=spill.get(row.pool, "fail"),
            )
        )
    return out
