"""``/v1/usage``: accounting reports grouped by tenant, user, pool and GPU model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.deps import EpochQuery, Svc, Who
from gpupool.api.views import usage_view
from gpupool.schemas.nodes import UsageReport

router = APIRouter(tags=["usage"])


@router.get("/v1/usage", response_model=UsageReport)
def usage(
    svc: Svc,
    who: Who,
    *,
    start: EpochQuery = None,  # default: 30 days before end
    end: EpochQuery = None,  # default: now
    group_by: Annotated[
        list[str] | None, Query(description="tenant, user, pool, gpu_model")
    ] = None,
    tenant: str | None = None,
) -> UsageReport:
    now = svc.cp.now()
    end_t = end if end is not None else now
    start_t = start if start is not None else end_t - 30 * 86400.0
    groups = tuple(group_by or ("tenant",))
    lines = svc.accounting.report(who, start_t, end_t, groups, tenant)
    return UsageReport(
        start=start_t, end=end_t, group_by=list(groups), lines=[usage_view(x) for x in lines]
    )
