"""``/v1/priorities``: every pending job's priority factors as the scheduler last ranked them
(see :mod:`gpupool.schemas.priority`); ``gpupool priority`` renders it like Slurm's sprio."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import Svc, Who
from gpupool.api.views import factor_views
from gpupool.control.services.jobviews import JobFilter
from gpupool.domain.states import JobState
from gpupool.schemas.priority import PriorityList, PriorityRow

router = APIRouter(tags=["jobs"])


@router.get("/v1/priorities", response_model=PriorityList)
def priorities(
    svc: Svc,
    who: Who,
    *,
    tenant: str | None = None,
    user: str | None = None,
    pool: str | None = None,
) -> PriorityList:
    """The pending jobs you may see, highest priority first, each with the factor table of the
    scheduler's last cycle (weight, value, contribution); unranked jobs last."""
    flt = JobFilter((JobState.PENDING,), tenant, user, pool)
    ranked = svc.loop.priorities if svc.loop is not None else {}
    rows: list[tuple[tuple[int, float, float, str], PriorityRow]] = []
    cursor: str | None = None
    while True:
        page = svc.jobs.list_jobs(who, flt, limit=1000, cursor=cursor)
        for detail in page.details:
            job = detail.job
            table = ranked.get(job.id)
            score = table.score if table is not None else None
            row = PriorityRow(
                id=job.id,
                name=job.spec.name,
                user=job.user,
                tenant=job.tenant,
                pool=job.spec.pool,
                priority_class=job.spec.priority_class,
                priority=score,
                factors=factor_views(table),
            )
            key = (0 if score is not None else 1, -(score or 0.0), job.submit_time, job.id)
            rows.append((key, row))
        cursor = page.next_cursor
        if cursor is None:
            break
    rows.sort(key=lambda item: item[0])
    return PriorityList(jobs=[row for _, row in rows])
