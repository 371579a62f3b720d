"""Stage 1, ordering: which pending job the cycle considers first.

The ``multifactor`` ordering gives each job a score, the weighted sum of five factors, each
normalised to [0, 1] (weights from :class:`~gpupool.scheduling.config.OrderingWeights`):

========== =================================================================================
priority   the job's priority value divided by the highest priority class (or the highest
           value among pending jobs, if larger)
size       the job's total milli-GPU over its pool's total milli-GPU, capped at 1;
           small-first (default) uses ``1 - that``, large-first uses it as is
age        seconds since the job became eligible, over ``max_age_s``, capped at 1
fairshare  ``2 ** (-U / S)`` as in Slurm's classic fair share: ``U`` is the tenant's share of
           all decayed usage, ``S`` its share of all fair shares; 1 when nobody used anything
efficiency the part of the pool's free milli-GPU on GPU models the job accepts (1 for jobs that
           accept any model or need no GPU): jobs that can use what is free go first
========== =================================================================================

Jobs are sorted by score (highest first); ties break by eligible time, then submit time, then
job id, so the order is total and deterministic. ``fifo`` ignores the factors and orders by
eligible time, submit time and id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress, count, islice
from operator import attrgetter, eq
from types import MappingProxyType
from typing import ClassVar, Protocol

import numpy as np

from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import Job
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.capacity import ClusterCapacity
from gpupool.scheduling.config import SchedulerConfig, SizeDirection
from gpupool.scheduling.decision import NoFactors, PriorityFactors
from gpupool.scheduling.snapshot import ClusterSnapshot


@dataclass(frozen=True)
class Ordering:
    """The pending jobs in the order the cycle considers them, with their factor tables.

    ``ids`` are the jobs' ids in the same order; ``factors`` maps each id to its table. Kept as
    parallel tuples and a mapping, not one object per job: a cycle over a queue of thousands
    builds no wrapper per waiting job.
    """

    jobs: tuple[Job, ...]
    ids: tuple[str, ...]
    factors: Mapping[str, PriorityFactors]


class OrderingStage(Protocol):
    """Orders pending jobs.

    Contract: :meth:`rank` returns every job of ``snapshot.pending`` exactly once, each with its
    factor table, in a total order that depends only on its arguments.
    """

    name: ClassVar[str]

    def rank(
        self, snapshot: ClusterSnapshot, config: SchedulerConfig, capacity: ClusterCapacity
    ) -> Ordering: ...


_PRIORITY = "the job's priority over the highest priority class"
_SMALL = "1 - the job's GPUs over its pool's GPUs (small jobs first)"
_LARGE = "the job's GPUs over its pool's GPUs (large jobs first)"
_AGE = "time waited since eligible over max_age_s"
_FAIRSHARE = "2^(-usage share / fair share) of the job's tenant"
_EFFICIENCY = "share of the pool's free GPU capacity on models the job accepts"
_NAMES = ("priority", "size", "age", "fairshare", "efficiency")
_SMALL_MEANINGS = (_PRIORITY, _SMALL, _AGE, _FAIRSHARE, _EFFICIENCY)
_LARGE_MEANINGS = (_PRIORITY, _LARGE, _AGE, _FAIRSHARE, _EFFICIENCY)


def _tie_key(job: Job) -> tuple[float, float, str]:
    return (job.eligible_time, job.submit_time, job.id)


_TIE_KEY = attrgetter("eligible_time", "submit_time", "id")  # _tie_key, without a Python call
_ID = attrgetter("id")
_ELIGIBLE = attrgetter("eligible_time")


class _PoolFacts:
    """Per-pool totals the size and efficiency factors need, computed once per cycle."""

    def __init__(self, capacity: ClusterCapacity, pool: str) -> None:
        arrays = capacity.arrays
        mask = capacity.mask(pool)
        self.total_milli = int(mask.sum()) * MILLI_PER_GPU
        # Per slot, by the slot's own model (a node may mix models).
        models = arrays.slot_model[mask]
        free = np.maximum(arrays.free_milli[mask], 0)
        n_models = len(arrays.model_names)
        self.free_by_model = np.bincount(models, weights=free, minlength=n_models)
        self.total_by_model = np.bincount(
            models, weights=np.full(len(models), float(MILLI_PER_GPU)), minlength=n_models
        )
        self._eff: dict[tuple[bool, ...] | None, float] = {}

    def efficiency(self, models: tuple[bool, ...] | None) -> float:
        if models is None:
            return 1.0
        found = self._eff.get(models)
        if found is None:
            allowed = np.asarray(models, dtype=np.bool_)
            base = self.free_by_model if self.free_by_model.sum() > 0 else self.total_by_model
            whole = float(base.sum())
            found = float(base[allowed].sum()) / whole if whole > 0 else 0.0
            self._eff[models] = found
        return found


def _fairshare_table(snapshot: ClusterSnapshot) -> Mapping[str, float]:
    tenants = (
        {t.name for t in snapshot.tenants}
        | set(snapshot.usage)
        | {j.tenant for j in snapshot.pending}
    )
    total_usage = sum(max(0.0, snapshot.usage.get(t, 0.0)) for t in tenants)
    total_share = sum(snapshot.fair_share(t) for t in tenants)
    table: dict[str, float] = {}
    for tenant in tenants:
        if total_usage <= 0 or total_share <= 0:
            table[tenant] = 1.0
            continue
        used = max(0.0, snapshot.usage.get(tenant, 0.0)) / total_usage
        share = snapshot.fair_share(tenant) / total_share
        # Shares are bounded (domain.tenants.FAIR_SHARE_MIN/MAX), so ``share`` is never 0 for
        # a real snapshot; a hand-made one still must not divide by zero.
        table[tenant] = float(2.0 ** (-used / share)) if share > 0 else (0.0 if used else 1.0)
    return table


class MultiFactor:
    """The design's multi-factor priority (see the module docstring)."""

    name: ClassVar[str] = "multifactor"

    def rank(
        self, snapshot: ClusterSnapshot, config: SchedulerConfig, capacity: ClusterCapacity
    ) -> Ordering:
        w = config.weights
        top = max(
            [
                1,
                *(c.value for c in snapshot.priority_classes),
                *(j.priority for j in snapshot.pending),
            ]
        )
        fair = _fairshare_table(snapshot)
        small_first = config.size_direction is SizeDirection.SMALL_FIRST
        max_age = config.max_age_s
        weights = (w.priority, w.size, w.age, w.fairshare, w.efficiency)
        facts: dict[str, _PoolFacts] = {}
        scored: list[tuple[float, Job, PriorityFactors]] = []
        for job in snapshot.pending:
            pool = job.spec.pool
            pf = facts.get(pool)
            if pf is None:
                pf = facts[pool] = _PoolFacts(capacity, pool)
            size = min(1.0, job.spec.total_gpu_milli / pf.total_milli) if pf.total_milli else 1.0
            size_value = 1.0 - size if small_first else size
            waited = snapshot.now - job.eligible_time
            res = job.spec.resources
            models = capacity.models_mask(res.gpu_types) if res.device_count else None
            values = (
                max(0.0, min(1.0, job.priority / top)),
                size_value,
                max(0.0, min(1.0, waited / max_age)),
                fair.get(job.tenant, 1.0),
                pf.efficiency(models),
            )
            table = PriorityFactors(
                job.id, values, _NAMES, weights, _SMALL_MEANINGS if small_first else _LARGE_MEANINGS
            )
            score = sum(wt * v for wt, v in zip(weights, values, strict=True))
            scored.append((score, job, table))
        scored.sort(key=lambda item: (-item[0], *_tie_key(item[1])))
        jobs = tuple([job for _, job, _ in scored])
        return Ordering(
            jobs, tuple(map(_ID, jobs)), MappingProxyType({t.job_id: t for _, _, t in scored})
        )


class Fifo:
    """First in, first out: eligible time, then submit time, then id."""

    name: ClassVar[str] = "fifo"

    def rank(
        self, snapshot: ClusterSnapshot, config: SchedulerConfig, capacity: ClusterCapacity
    ) -> Ordering:
        # Sort on eligible time alone (floats compare fast; queues arrive nearly in order);
        # only where two jobs share an eligible time is the full key needed.
        by_time = sorted(snapshot.pending, key=_ELIGIBLE)
        times = list(map(_ELIGIBLE, by_time))
        # i where jobs i and i + 1 share an eligible time; each run of them is one tie group.
        ties = list(compress(count(), map(eq, times, islice(times, 1, None))))
        k = 0
        while k < len(ties):
            first = end = ties[k]
            while k + 1 < len(ties) and ties[k + 1] == end + 1:
                k += 1
                end += 1
            by_time[first : end + 2] = sorted(by_time[first : end + 2], key=_TIE_KEY)
            k += 1
        jobs = tuple(by_time)
        ids = tuple(map(_ID, jobs))
        return Ordering(jobs, ids, NoFactors(ids))


#: name -> ordering stage.
ORDERINGS: dict[str, type[OrderingStage]] = {
    "fifo": Fifo,
    "multifactor": MultiFactor,
}


def make_ordering(name: str) -> OrderingStage:
    """The ordering stage registered as ``name``."""
    found = ORDERINGS.get(name)
    if found is None:
        raise InvalidValue(
            f"ordering {name!r} is not known: use one of {', '.join(sorted(ORDERINGS))}",
            field="ordering",
        )
    return found()
