"""The numbers of a replay report, computed from a :class:`~gpupool.sim.replay.ReplayResult`.

Words (times in seconds, GPU amounts in GPUs unless a name says milli):

- **allocation**: allocated milli-GPU·s over capacity milli-GPU·s, from the first arrival to
  the last event (the time-average share of the cluster held by jobs). A few long jobs left
  running after the last arrival dilute it, so **allocation while arriving** is the same from
  the first to the last arrival, against the nominal capacity: the busy part of the trace.
- **busy GPUs**: time-average number of devices with any slice on them, over the GPU count.
- **queueing delay**: submit to first start, for jobs that started; **JCT** (job completion
  time): submit to completion, for completed jobs. Percentiles are linear interpolations.
- **makespan**: first submit to last completion.
- **lost GPU-hours**: GPU share x seconds of work thrown away by preemptions and node failures
  (work since each run's last checkpoint).
- **fairness**: Jain's index ``(sum x)^2 / (n sum x^2)`` over tenants' normalised shares ``x``
  (allocated over max-min entitled GPU-time, see :mod:`gpupool.sim.recorder`); 1 is perfectly
  fair, ``1/n`` is one tenant getting everything. Tenants never entitled to anything are left
  out.
- **fragmentation**: stranded milli-GPU·s (free share on partly used devices) over free
  milli-GPU·s, and the time-average stranded GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.sim.replay import ReplayResult

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Distribution:
    """Count, mean and p50/p95/p99 of some seconds; ``None`` where there is no sample."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        data = np.fromiter(values, dtype=np.float64)
        if data.size == 0:
            return cls(0, None, None, None, None)
        p50, p95, p99 = (float(v) for v in np.percentile(data, PERCENTILES))
        return cls(int(data.size), float(data.mean()), p50, p95, p99)


@dataclass(frozen=True)
class TenantSummary:
    name: str
    jobs: int
    completed: int
    queueing_delay: Distribution
    jct: Distribution
    gpu_hours: float
    normalised_share: float | None


@dataclass(frozen=True)
class Summary:
    """One scenario's report numbers."""

    scenario: str
    workload: str
    cluster: str
    gpus: int
    jobs: int
    outcomes: Mapping[str, int]
    makespan_s: float | None
    allocation: float
    allocation_while_arriving: float
    busy_gpus: float
    queueing_delay: Distribution
    jct: Distribution
    preemptions: int
    node_failures: int
    used_gpu_hours: float
    lost_gpu_hours: float
    fairness: float | None
    fragmentation: float
    stranded_gpus: float
    tenants: tuple[TenantSummary, ...]
    cycles: int
    events: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def jain(values: Iterable[float]) -> float | None:
    """Jain's fairness index; ``None`` for no values."""
    data = np.fromiter(values, dtype=np.float64)
    if data.size == 0 or not np.any(data):
        return None
    return float(data.sum() ** 2 / (data.size * np.square(data).sum()))


def _window_allocation(result: ReplayResult) -> float:
    """Allocated share of the nominal capacity between the first and the last arrival."""
    if not result.jobs or not result.series.time:
        return 0.0
    start = min(j.submit_time for j in result.jobs)
    end = max(j.submit_time for j in result.jobs)
    if end <= start:
        return 0.0
    t = np.asarray(result.series.time, dtype=np.float64)
    alloc = np.asarray(result.series.allocated_milli, dtype=np.float64)
    # The state at sample k holds until sample k + 1: clip each step to [start, end].
    right = np.append(t[1:], t[-1])
    widths = np.clip(np.minimum(right, end) - np.maximum(t, start), 0.0, None)
    return float((alloc * widths).sum() / (result.capacity_milli * (end - start)))


def summarise(result: ReplayResult) -> Summary:
    """The report numbers of one replay."""
    jobs = result.jobs
    outcomes: dict[str, int] = {}
    for j in jobs:
        outcomes[j.outcome] = outcomes.get(j.outcome, 0) + 1
    ends = [j.end_time for j in jobs if j.outcome == "completed" and j.end_time is not None]
    first = min((j.submit_time for j in jobs), default=0.0)
    integ = result.integrals
    shares: dict[str, float | None] = {}
    for tenant in result.tenants:
        entitled = integ.tenant_entitled_milli_s.get(tenant, 0.0)
        allocated = integ.tenant_allocated_milli_s.get(tenant, 0.0)
        shares[tenant] = allocated / entitled if entitled > 0 else None
    tenants = []
    for tenant in result.tenants:
        mine = [j for j in jobs if j.tenant == tenant]
        tenants.append(
            TenantSummary(
                name=tenant,
                jobs=len(mine),
                completed=sum(1 for j in mine if j.outcome == "completed"),
                queueing_delay=Distribution.of(
                    d for j in mine if (d := j.queueing_delay_s) is not None
                ),
                jct=Distribution.of(c for j in mine if (c := j.completion_time_s) is not None),
                gpu_hours=sum(j.used_milli_s for j in mine) / MILLI_PER_GPU / 3600.0,
                normalised_share=shares[tenant],
            )
        )
    span_gpu_s = integ.capacity_milli_s / MILLI_PER_GPU
    return Summary(
        scenario=result.scenario,
        workload=result.workload,
        cluster=result.cluster,
        gpus=result.gpu_count,
        jobs=len(jobs),
        outcomes=outcomes,
        makespan_s=(max(ends) - first) if ends else None,
        allocation=integ.allocated_milli_s / integ.capacity_milli_s if span_gpu_s else 0.0,
        allocation_while_arriving=_window_allocation(result),
        busy_gpus=integ.busy_gpu_s / span_gpu_s if span_gpu_s else 0.0,
        queueing_delay=Distribution.of(d for j in jobs if (d := j.queueing_delay_s) is not None),
        jct=Distribution.of(c for j in jobs if (c := j.completion_time_s) is not None),
        preemptions=sum(j.preemptions for j in jobs),
        node_failures=sum(j.node_failures for j in jobs),
        used_gpu_hours=sum(j.used_milli_s for j in jobs) / MILLI_PER_GPU / 3600.0,
        lost_gpu_hours=sum(j.lost_milli_s for j in jobs) / MILLI_PER_GPU / 3600.0,
        fairness=jain(v for v in shares.values() if v is not None),
        fragmentation=integ.stranded_milli_s / integ.free_milli_s if integ.free_milli_s else 0.0,
        stranded_gpus=(
            integ.stranded_milli_s / MILLI_PER_GPU / integ.span_s if integ.span_s else 0.0
        ),
        tenants=tuple(tenants),
        cycles=result.cycles,
        events=result.events,
    )
