"""Stage 2, admission: may this tenant start this job in this pool, and on what terms?

Per tenant and pool a :class:`~gpupool.domain.tenants.Quota` gives ``guaranteed`` and ``limit``
amounts of milli-GPU and GPU memory. The tenant's *use* is what its running jobs hold plus what
this cycle already started for it. A job that would bring use to

- at most ``guaranteed`` is **in-quota**: it may preempt borrowers to get its room;
- above ``guaranteed`` but at most ``limit`` **borrows**: it runs only on idle capacity (it never
  preempts) and may be reclaimed by another tenant's in-quota job. Only preemptible jobs may
  borrow, because borrowed capacity must be reclaimable; a non-preemptible job above its
  guarantee waits with ``QuotaExceeded``;
- above ``limit`` waits with ``QuotaExceeded``.

GPU memory counts against the guarantee only when the quota guarantees some
(``guaranteed_memory_mib > 0``), and against the limit only when it sets one. A tenant with no
quota in a pool is unmanaged there: always in-quota, never limited.
With a GPU-hour budget, a tenant whose ``budget_used`` in the pool reached the budget waits with
``BudgetExhausted`` until the window moves on.

**Never admitted**: a job that no amount of waiting could admit, because it *alone* passes the
quota (more than the limit, or, not preemptible, more than the guarantee), would wait forever
even on an empty cluster. :func:`never_admitted` says so, naming the limit and what to change
(ask for less, mark it preemptible, or have an admin change the quota); the submit refuses
such a job with that sentence (``control/services/envelope.py``), and one already queued when
the quota changed waits with it as its ``QuotaExceeded`` message. The design keeps the
guarantee's promise instead of admitting the job when the pool is idle: a non-preemptible job
on borrowed capacity could not be reclaimed, so another team's guaranteed share would wait for
it to end.

Which running jobs are *borrowing*: a replica's explicit ``borrowing`` flag wins; otherwise the
tenant's jobs are taken in start order and those that pass the guarantee are the borrowers.

Stages: ``quota`` (the above) and ``none`` (everything in-quota, no limits).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import Job
from gpupool.domain.tenants import Quota
from gpupool.domain.units import format_gpus, format_memory
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.snapshot import ClusterSnapshot


class Standing(enum.Enum):
    """A job's standing against its tenant's quota."""

    IN_QUOTA = "in-quota"
    BORROWING = "borrowing"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Verdict:
    """The admission answer; ``reason`` and ``message`` are set when ``REJECTED``."""

    standing: Standing
    reason: PendingReason | None = None
    message: str = ""

    @property
    def admitted(self) -> bool:
        return self.standing is not Standing.REJECTED


_IN_QUOTA = Verdict(Standing.IN_QUOTA)  # the common answer, shared (verdicts are frozen)


class Ledger(Protocol):
    """Running use per tenant and pool within one cycle.

    Contract: :meth:`check` never changes the ledger; :meth:`commit` and :meth:`release` move
    use. After any sequence of ``check``-then-``commit`` calls, a tenant's use is within its
    limit if it was before.
    """

    #: ``True`` when :meth:`check` admits every job (a cycle may skip calling it).
    admits_all: bool

    def check(self, job: Job, gpu_milli: int, gpu_memory_mib: int) -> Verdict: ...

    def commit(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None: ...

    def release(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None: ...

    def is_borrowing(self, job_id: str) -> bool:
        """For a running job: does it hold borrowed (reclaimable) capacity?

        Decided when the ledger opens: :meth:`commit` and :meth:`release` do not change it.
        """
        ...


class AdmissionStage(Protocol):
    """Opens the ledger of one cycle from the snapshot."""

    name: ClassVar[str]

    def open(self, snapshot: ClusterSnapshot, config: SchedulerConfig) -> Ledger: ...


def _memory_governed(quota: Quota) -> bool:
    """Does the guarantee say anything about GPU memory?"""
    return quota.guaranteed_memory_mib > 0


def never_admitted(
    quota: Quota | None,
    *,
    tenant: str,
    pool: str,
    preemptible: bool,
    gpu_milli: int,
    gpu_memory_mib: int,
) -> str | None:
    """Why a job asking for ``gpu_milli`` and ``gpu_memory_mib`` (over all its replicas) can
    never be admitted under ``quota`` whatever else runs, or ``None`` when it can.

    The sentence names the limit it passes and what to change."""
    if quota is None or (gpu_milli == 0 and gpu_memory_mib == 0):
        return None
    where = f"tenant {tenant}'s"
    admin = f"or have an admin change the quota (gpupool quota set {tenant} {pool} ...)"
    if quota.limit_milli is not None and gpu_milli > quota.limit_milli:
        return (
            f"this job's {format_gpus(gpu_milli)} GPUs are more than {where} limit of "
            f"{format_gpus(quota.limit_milli)} GPUs in pool {pool}, so it can never start: "
            f"ask for at most {format_gpus(quota.limit_milli)} GPUs (over all replicas), {admin}"
        )
    if quota.limit_memory_mib is not None and gpu_memory_mib > quota.limit_memory_mib:
        return (
            f"this job's {format_memory(gpu_memory_mib)} of GPU memory is more than {where} "
            f"limit of {format_memory(quota.limit_memory_mib)} in pool {pool}, so it can never "
            f"start: ask for at most {format_memory(quota.limit_memory_mib)}, {admin}"
        )
    if preemptible:
        return None
    over_milli = gpu_milli > quota.guaranteed_milli
    if over_milli or (_memory_governed(quota) and gpu_memory_mib > quota.guaranteed_memory_mib):
        asked, share = (
            (f"{format_gpus(gpu_milli)} GPUs", f"{format_gpus(quota.guaranteed_milli)} GPUs")
            if over_milli
            else (
                f"{format_memory(gpu_memory_mib)} of GPU memory",
                format_memory(quota.guaranteed_memory_mib),
            )
        )
        return (
            f"this job's {asked} are more than {where} guaranteed {share} in pool {pool}, and "
            "a job that is not preemptible may use only the guarantee, so it can never start: "
            "mark the job preemptible (--preemptible) to let it borrow idle GPUs, ask for at "
            f"most {share}, {admin}"
        )
    return None


class QuotaLedger:
    """The ``quota`` ledger (see the module docstring)."""

    admits_all = False

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._snapshot = snapshot
        self._milli: dict[tuple[str, str], int] = {}
        self._mem: dict[tuple[str, str], int] = {}
        self._borrowing: set[str] = set()
        milli_of, mem_of = self._milli, self._mem
        implicit = False  # some job leaves its borrowing to the start order
        for job_id, replicas in snapshot.running_by_job.items():
            first = replicas[0]
            key = (first.tenant, first.pool)
            if len(replicas) == 1:  # the common case, without generator overhead
                milli, mem = first.gpu_milli, first.gpu_memory_mib
                explicit = first.borrowing
            else:
                milli = sum(r.gpu_milli for r in replicas)
                mem = sum(r.gpu_memory_mib for r in replicas)
                explicit = next((r.borrowing for r in replicas if r.borrowing is not None), None)
            milli_of[key] = milli_of.get(key, 0) + milli
            mem_of[key] = mem_of.get(key, 0) + mem
            if explicit is None:
                implicit = True
            elif explicit:
                self._borrowing.add(job_id)
        if implicit:
            self._infer_borrowing(snapshot)

    def _infer_borrowing(self, snapshot: ClusterSnapshot) -> None:
        """Borrowers among the jobs without an explicit flag: those whose use, counted in start
        order (then job id) with the tenant's jobs before them, passes the guarantee."""
        milli_so_far: dict[tuple[str, str], int] = {}
        mem_so_far: dict[tuple[str, str], int] = {}
        jobs = sorted(snapshot.running_by_job.items(), key=lambda kv: (kv[1][0].start_time, kv[0]))
        for job_id, replicas in jobs:
            first = replicas[0]
            key = (first.tenant, first.pool)
            milli = milli_so_far[key] = milli_so_far.get(key, 0) + sum(
                r.gpu_milli for r in replicas
            )
            mem = mem_so_far[key] = mem_so_far.get(key, 0) + sum(r.gpu_memory_mib for r in replicas)
            if any(r.borrowing is not None for r in replicas):
                continue  # explicit: counted above
            quota = snapshot.quota(*key)
            if quota is not None and (
                milli > quota.guaranteed_milli
                or (_memory_governed(quota) and mem > quota.guaranteed_memory_mib)
            ):
                self._borrowing.add(job_id)

    def use(self, tenant: str, pool: str) -> tuple[int, int]:
        """(milli-GPU, MiB) the tenant holds in ``pool`` now."""
        key = (tenant, pool)
        return self._milli.get(key, 0), self._mem.get(key, 0)

    def check(self, job: Job, gpu_milli: int, gpu_memory_mib: int) -> Verdict:
        pool = job.spec.pool
        quota = self._snapshot.quota(job.tenant, pool)
        if quota is None:
            return _IN_QUOTA
        where = f"tenant {job.tenant} in pool {pool}"
        if quota.gpu_hour_budget is not None:
            used = self._snapshot.budget_used.get((job.tenant, pool), 0.0)
            if used >= quota.gpu_hour_budget:
                days = quota.budget_window_s / 86400
                return Verdict(
                    Standing.REJECTED,
                    PendingReason.BUDGET_EXHAUSTED,
                    f"{where} used {used:.1f} of its {quota.gpu_hour_budget:.1f} GPU-hours in the "
                    f"last {days:g} days; it starts when the window moves on or an admin raises "
                    "the budget",
                )
        if gpu_milli == 0 and gpu_memory_mib == 0:
            return _IN_QUOTA
        never = never_admitted(
            quota,
            tenant=job.tenant,
            pool=pool,
            preemptible=job.spec.preemptible,
            gpu_milli=gpu_milli,
            gpu_memory_mib=gpu_memory_mib,
        )
        if never is not None:
            return Verdict(Standing.REJECTED, PendingReason.QUOTA_EXCEEDED, never)
        milli, mem = self.use(job.tenant, pool)
        new_milli, new_mem = milli + gpu_milli, mem + gpu_memory_mib
        if quota.limit_milli is not None and new_milli > quota.limit_milli:
            return Verdict(
                Standing.REJECTED,
                PendingReason.QUOTA_EXCEEDED,
                f"{where} holds {format_gpus(milli)} GPUs; this job's {format_gpus(gpu_milli)} "
                f"would pass its limit of {format_gpus(quota.limit_milli)}: it starts when the "
                "tenant's other jobs finish",
            )
        if quota.limit_memory_mib is not None and new_mem > quota.limit_memory_mib:
            return Verdict(
                Standing.REJECTED,
                PendingReason.QUOTA_EXCEEDED,
                f"{where} holds {format_memory(mem)} of GPU memory; this job's "
                f"{format_memory(gpu_memory_mib)} would pass its limit of "
                f"{format_memory(quota.limit_memory_mib)}",
            )
        within = new_milli <= quota.guaranteed_milli and (
            not _memory_governed(quota) or new_mem <= quota.guaranteed_memory_mib
        )
        if within:
            return _IN_QUOTA
        if not job.spec.preemptible:
            return Verdict(
                Standing.REJECTED,
                PendingReason.QUOTA_EXCEEDED,
                f"{where} would pass its guaranteed {format_gpus(quota.guaranteed_milli)} GPUs; "
                "only preemptible jobs may borrow idle capacity: mark the job preemptible, or "
                "wait for the tenant's other jobs to finish",
            )
        return Verdict(Standing.BORROWING)

    def commit(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None:
        key = (tenant, pool)
        self._milli[key] = self._milli.get(key, 0) + gpu_milli
        self._mem[key] = self._mem.get(key, 0) + gpu_memory_mib

    def release(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None:
        self.commit(tenant, pool, -gpu_milli, -gpu_memory_mib)

    def is_borrowing(self, job_id: str) -> bool:
        return job_id in self._borrowing


class QuotaAdmission:
    """Guaranteed / limit per tenant and pool, optional GPU-hour budget."""

    name: ClassVar[str] = "quota"

    def open(self, snapshot: ClusterSnapshot, config: SchedulerConfig) -> Ledger:
        return QuotaLedger(snapshot)


class _OpenLedger:
    admits_all = True  # every job is in quota

    def check(self, job: Job, gpu_milli: int, gpu_memory_mib: int) -> Verdict:
        return _IN_QUOTA

    def commit(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None:
        return None

    def release(self, tenant: str, pool: str, gpu_milli: int, gpu_memory_mib: int) -> None:
        return None

    def is_borrowing(self, job_id: str) -> bool:
        return False


class NoAdmission:
    """No quotas: every job is in-quota (single-team installs, experiments)."""

    name: ClassVar[str] = "none"

    def open(self, snapshot: ClusterSnapshot, config: SchedulerConfig) -> Ledger:
        return _OpenLedger()


#: name -> admission stage.
ADMISSIONS: dict[str, type[AdmissionStage]] = {
    "none": NoAdmission,
    "quota": QuotaAdmission,
}


def make_admission(name: str) -> AdmissionStage:
    """The admission stage registered as ``name``."""
    found = ADMISSIONS.get(name)
    if found is None:
        raise InvalidValue(
            f"admission {name!r} is not known: use one of {', '.join(sorted(ADMISSIONS))}",
            field="admission",
        )
    return found()
