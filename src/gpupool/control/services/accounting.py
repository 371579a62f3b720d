"""Accounting: what every job used on every device, and reports over it.

Words and units:

- **allocated milli-seconds**: a slice's milli-GPU times the seconds it was held; 3,600,000
  is one whole GPU for one hour. **MiB-seconds** likewise for the slice's GPU memory.
- **busy milli-seconds**: allocated milli-seconds weighted by the device's utilisation ratio
  from telemetry (a device shared by several jobs is assumed busy in proportion to the shares,
  because NVML reports utilisation per device, not per process). A missing sample counts as 0.
- **idle share**: ``1 - busy / allocated``.
- **cost**: allocated GPU-hours times the pool's price per GPU-hour for the device's model.

Usage accrues whenever a node reports (heartbeat) and when a slice is released, into one row
per job, device and hour (``bucket_start``), so reports over a window are exact to the hour.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid
from gpupool.control.services.auth import Principal, require
from gpupool.domain.pools import Pool
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.domain.users import Permission
from gpupool.store.mapping import pool_from_row
from gpupool.store.models import DeviceModel, JobModel, PoolModel, SliceModel, UsageModel

BUCKET_S = 3600.0
GROUPS = ("tenant", "user", "pool", "gpu_model")


def _buckets(start: float, end: float) -> list[tuple[float, float]]:
    """Split ``[start, end)`` at hour boundaries: ``[(bucket_start, seconds), ...]``."""
    out: list[tuple[float, float]] = []
    t = start
    while t < end:
        bucket = math.floor(t / BUCKET_S) * BUCKET_S
        stop = min(end, bucket + BUCKET_S)
        out.append((bucket, stop - t))
        t = stop
    return out


def accrue(session: Session, slices: list[SliceModel], now: float) -> None:
    """Add usage of ``slices`` from their ``accounted_until`` to ``now`` (same transaction)."""
    if not slices:
        return
    devices = {
        d.uuid: d
        for d in session.scalars(
            select(DeviceModel).where(DeviceModel.uuid.in_({s.device_uuid for s in slices}))
        )
    }
    jobs = {
        j.id: j
        for j in session.scalars(
            select(JobModel).where(JobModel.id.in_({s.job_id for s in slices}))
        )
    }
    pools: dict[str, Pool] = {}
    plans: list[tuple[SliceModel, DeviceModel, JobModel, float, list[tuple[float, float]]]] = []
    for sl in slices:
        if now <= sl.accounted_until:
            continue
        device, job = devices.get(sl.device_uuid), jobs.get(sl.job_id)
        if device is None or job is None:
            sl.accounted_until = now
            continue
        if job.pool not in pools:
            prow = session.get(PoolModel, job.pool)
            pools[job.pool] = pool_from_row(prow) if prow else Pool(name="default")
        price = pools[job.pool].price_of(device.model)
        plans.append((sl, device, job, price, _buckets(sl.accounted_until, now)))
    if not plans:
        return
    # The rows to add to, in one query (a heartbeat of a node with 8 slices used to ask 8
    # times); two slices of one job on one device share their row.
    rows = {
        (r.job_id, r.device_uuid, r.bucket_start): r
        for r in session.scalars(
            select(UsageModel).where(
                UsageModel.job_id.in_({sl.job_id for sl, *_ in plans}),
                UsageModel.bucket_start.in_({b for *_, span in plans for b, _ in span}),
            )
        )
    }
    for sl, device, job, price, span in plans:
        util = device.utilization_ratio or 0.0
        for bucket, seconds in span:
            key = (sl.job_id, sl.device_uuid, bucket)
            row = rows.get(key)
            if row is None:
                row = UsageModel(
                    job_id=sl.job_id,
                    device_uuid=sl.device_uuid,
                    bucket_start=bucket,
                    tenant=job.tenant,
                    user=job.user,
                    pool=job.pool,
                    gpu_model=device.model,
                    milli_seconds=0.0,
                    mib_seconds=0.0,
                    busy_milli_seconds=0.0,
                    cost=0.0,
                )
                session.add(row)
                rows[key] = row
            milli_s = sl.milli * seconds
            row.milli_seconds += milli_s
            row.mib_seconds += sl.memory_mib * seconds
            row.busy_milli_seconds += milli_s * util
            row.cost += milli_s / MILLI_PER_GPU / 3600.0 * price
        sl.accounted_until = now


@dataclass(frozen=True)
class UsageLine:
    """One group of a usage report. ``gpu_hours`` = allocated whole-GPU hours."""

    key: dict[str, str]
    milli_seconds: float
    mib_seconds: float
    busy_milli_seconds: float
    cost: float
    jobs: int

    @property
    def gpu_hours(self) -> float:
        return self.milli_seconds / MILLI_PER_GPU / 3600.0

    @property
    def utilization_ratio(self) -> float:
        return self.busy_milli_seconds / self.milli_seconds if self.milli_seconds else 0.0

    @property
    def idle_ratio(self) -> float:
        return 1.0 - self.utilization_ratio if self.milli_seconds else 0.0


class AccountingService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def report(
        self,
        principal: Principal,
        start: float,
        end: float,
        group_by: tuple[str, ...] = ("tenant",),
        tenant: str | None = None,
    ) -> list[UsageLine]:
        """Usage in hour buckets overlapping ``[start, end)``, grouped by ``group_by``."""
        require(principal, Permission.USAGE_READ, Permission.USAGE_READ_ANY)
        unknown = [g for g in group_by if g not in GROUPS]
        if unknown:
            raise Invalid(f"cannot group usage by {unknown[0]!r}: use {', '.join(GROUPS)}")
        if end <= start:
            raise Invalid("the report window is empty: 'end' must be after 'start'")
        if not principal.can(Permission.USAGE_READ_ANY):
            tenant = principal.tenant  # tenant roles see their own tenant only
        query = select(UsageModel).where(
            UsageModel.bucket_start >= math.floor(start / BUCKET_S) * BUCKET_S,
            UsageModel.bucket_start < end,
        )
        if tenant is not None:
            query = query.where(UsageModel.tenant == tenant)
        sums: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        jobs: dict[tuple[str, ...], set[str]] = defaultdict(set)
        with self.cp.read() as s:
            for row in s.scalars(query):
                key = tuple(str(getattr(row, g)) for g in group_by)
                acc = sums[key]
                acc[0] += row.milli_seconds
                acc[1] += row.mib_seconds
                acc[2] += row.busy_milli_seconds
                acc[3] += row.cost
                jobs[key].add(row.job_id)
        return [
            UsageLine(
                key=dict(zip(group_by, key, strict=True)),
                milli_seconds=vals[0],
                mib_seconds=vals[1],
                busy_milli_seconds=vals[2],
                cost=vals[3],
                jobs=len(jobs[key]),
            )
            for key, vals in sorted(sums.items())
        ]
