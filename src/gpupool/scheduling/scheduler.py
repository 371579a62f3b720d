"""``schedule(snapshot, config, memo) -> Decision``: one pure scheduling cycle.

The cycle, as the design describes it (each step a registered stage):

1. **order** the pending jobs (:mod:`~gpupool.scheduling.ordering`);
2. for each job in that order (:meth:`_Cycle.consider`): **skip** it if it is held, not yet
   eligible or names an unknown pool; **admit** it against its tenant's quota
   (:mod:`~gpupool.scheduling.admission`);
3. pass the pool's backfill **gate** (:mod:`~gpupool.scheduling.reservation`): a job that
   would delay the pool's reserved job does not start, and in strict order nothing starts
   behind a blocked job;
4. **place** it with its pool's policy (:mod:`~gpupool.scheduling.fit`);
5. if it is **blocked** and in-quota, try **preemption** (:mod:`~gpupool.scheduling.preemption`);
   the room freed is held for it until its victims are gone; otherwise the first blocked job
   of a pool gets the **reservation**, and every job left pending gets a reason and an
   estimated start.

Nothing here performs I/O, reads a clock or draws an unseeded random number: the free capacity
is built once from the snapshot (:mod:`~gpupool.scheduling.capacity`) and updated in place as the
cycle starts jobs, so the same snapshot always gives the same decision. What one cycle can
reuse from the caller's earlier ones (the cluster's layout, what running replicas hold, the
shapes of queued requests) is in the caller's :class:`~gpupool.scheduling.memo.SchedulerMemo`,
passed in; it saves work and never changes a decision.

The cycle's working state is :class:`~gpupool.scheduling.cyclestate.CycleState` (per pool
:class:`~gpupool.scheduling.cyclestate.PoolState`); step 5, a blocked job, is
:class:`~gpupool.scheduling.blocked.BlockedJobs`; both are bases of :class:`_Cycle`.
"""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter
from types import MappingProxyType

import numpy as np

from gpupool.domain.jobs import Job
from gpupool.scheduling.admission import Standing
from gpupool.scheduling.blocked import BlockedJobs
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.constraints import node_allowed
from gpupool.scheduling.cyclestate import NodeKey, PoolState, Where
from gpupool.scheduling.decision import (
    Decision,
    PendingInfo,
    PendingReason,
    ReplicaStart,
    Reservation,
    Start,
)
from gpupool.scheduling.fit import Placed, allocate_all, place_job, release_all
from gpupool.scheduling.learning import show_arrivals
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.ordering import Ordering, make_ordering
from gpupool.scheduling.placement.base import CapacityArrays, Shape
from gpupool.scheduling.release import Release
from gpupool.scheduling.reservation import Gate, intersect
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.scheduling.timemin import shortened_limit

_HELD = attrgetter("held")
_ELIGIBLE = attrgetter("eligible_time")
_POOL = attrgetter("spec.pool")


def _job_end(job: Job, now: float) -> float | None:
    spec = job.spec
    duration = (
        spec.expected_duration_s if spec.expected_duration_s is not None else spec.time_limit_s
    )
    return None if duration is None else now + duration


class _Cycle(BlockedJobs):
    """One call to :func:`schedule`: the steps of the cycle (see the module docstring)."""

    # ----------------------------------------------------------------- the cycle

    def run(self, ordering: Ordering) -> None:
        pools = [self.pool(name) for name in self.snapshot.pool_by_name]
        show_arrivals(
            self.snapshot, self.capacity, {p.name: p.policy for p in pools if p.policy.learns}
        )
        jobs = ordering.jobs
        limit = self.config.max_jobs_per_cycle
        stop = len(jobs) if limit is None else min(limit, len(jobs))
        running_ids = self.running_ids
        index = 0
        while index < stop:
            job = jobs[index]
            index += 1
            if job.id in running_ids:
                continue  # already running (a stale queue entry): nothing to decide
            self.consider(job)
            if self.sealed is not None:
                self.sweep(self.sealed, jobs[index:stop], ordering.ids[index:stop])
                break
        if stop < len(jobs):
            info = PendingInfo(
                PendingReason.CYCLE_LIMIT,
                f"only the first {limit} jobs in the queue are considered per cycle",
            )
            tail = [i for i in ordering.ids[stop:] if i not in running_ids]
            self.pending.update(dict.fromkeys(tail, info))

    def sweep(self, sealed: PoolState, rest: tuple[Job, ...], ids: tuple[str, ...]) -> None:
        """Decide ``rest`` (ids ``ids``), the queue after ``sealed`` was sealed, without a call
        per waiting job.

        A sealed pool's waiting jobs all get its shared answer (what :meth:`consider` would
        give each of them). When every job left is such a job (that pool, none held, none
        waiting out a delay, none already running: the usual long FIFO queue) they are answered
        in one step; otherwise each goes through :meth:`consider` in order, as before.
        """
        running_ids, closed = self.running_ids, sealed.closed
        assert closed is not None
        # The checks of consider, each over the whole rest in one C-level pass.
        if (
            rest
            and not any(map(_HELD, rest))
            and max(map(_ELIGIBLE, rest)) <= self.now
            and set(map(_POOL, rest)) == {sealed.name}
            and running_ids.isdisjoint(ids)
        ):
            self.pending.update(dict.fromkeys(ids, closed[1]))
            return
        for job in rest:
            if job.id not in running_ids:
                self.consider(job)

    def consider(self, job: Job) -> None:
        """Decide ``job``, in the five steps of the cycle: **skip** it (held, not eligible yet,
        unknown pool), **admit** it against its tenant's quota, pass its pool's backfill
        **gate**, **place** it, or else handle it as **blocked** (preemption, reservation,
        a reason and an estimate). Each step that settles the job records the answer itself.
        """
        if self.skip(job):
            return
        pool = self.pool(job.spec.pool)
        if self.behind_closed_gate(job, pool):
            return
        admitted = self.admit(job)
        if admitted is None:
            return
        shape, standing = admitted
        end = _job_end(job, self.now)
        gate = self.gate(job, pool, end)
        if gate is None:
            return
        where = self.where(job, pool)
        if self.place(job, pool, shape, end, gate, where=where):
            return
        if gate.shadow is not None and self.place_shortened(job, pool, shape, where):
            return
        self.blocked(
            job, pool, shape, job.spec.replicas, standing=standing, shadow=gate.shadow, where=where
        )

    def where(self, job: Job, pool: PoolState) -> Where:
        """The nodes of ``pool`` that ``job`` may use: all of them, or those its ``nodelist``
        names and its ``exclude`` does not (sbatch ``--nodelist`` / ``--exclude``), and whose
        features satisfy its ``constraint`` (``--constraint``, see :func:`node_allowed`)."""
        spec = job.spec
        if not spec.nodelist and not spec.exclude and spec.constraint is None:
            return Where(pool.nodes)
        text = spec.constraint.text if spec.constraint is not None else ""
        key: NodeKey = (spec.nodelist, spec.exclude, text)
        found = pool.node_masks.get(key)
        if found is None:
            features = self.node_features()
            allowed = np.fromiter(
                (node_allowed(spec, n, features) for n in self.capacity.arrays.node_names),
                dtype=np.bool_,
                count=len(self.capacity.arrays.node_names),
            )
            found = pool.node_masks[key] = pool.nodes & allowed
        return Where(found, key)

    def skip(self, job: Job) -> bool:
        """Step 1: True (and its reason given) when ``job`` is not for this cycle: held, not
        eligible yet, or in a pool that does not exist."""
        if job.held:
            self.wait(job, PendingReason.HELD, f"held until released (gpupool release {job.id})")
            return True
        if job.eligible_time > self.now:
            if job.restart_count == 0 and job.eligible_time > job.submit_time:
                self.wait(
                    job,
                    PendingReason.BEGIN_TIME,
                    f"it was submitted to begin at t={job.eligible_time:.0f} (--begin), in "
                    f"{job.eligible_time - self.now:.0f} s",
                    job.eligible_time,
                )
                return True
            self.wait(
                job,
                PendingReason.NOT_ELIGIBLE,
                "not eligible yet (it is waiting out a requeue delay)",
                job.eligible_time,
            )
            return True
        if job.spec.pool not in self.snapshot.pool_by_name:
            known = ", ".join(sorted(self.snapshot.pool_by_name))
            self.wait(
                job,
                PendingReason.POOL_UNKNOWN,
                f"pool {job.spec.pool!r} does not exist: use one of {known}",
            )
            return True
        return False

    def behind_closed_gate(self, job: Job, pool: PoolState) -> bool:
        """Fast path before step 2: True (and the pool's shared answer given) when ``pool`` is
        in strict order behind a blocked job and no quota can refuse anyone, so steps 2 and 3
        would end in that same shared reason; it is given without the shape, check and gate.
        """
        closed = pool.closed
        if closed is not None and pool.backfill.closes_all and self.ledger.admits_all:
            self.pending[job.id] = closed[1]
            return True
        return False

    def admit(self, job: Job) -> tuple[Shape, Standing] | None:
        """Step 2: the job's replica shape and its standing in quota, or ``None`` (and the
        reason given) when its quota refuses it, counting the GPU memory it names."""
        shape = self.shape_of(job)
        explicit_mem = (shape.memory_mib or 0) * shape.count * job.spec.replicas
        verdict = self.ledger.check(job, job.spec.total_gpu_milli, explicit_mem)
        if not verdict.admitted:
            assert verdict.reason is not None
            self.wait(job, verdict.reason, verdict.message)
            return None
        return shape, verdict.standing

    def gate(self, job: Job, pool: PoolState, end: float | None) -> Gate | None:
        """Step 3: the pool's backfill gate for a job ending at ``end``, or ``None`` when it is
        closed (the job then gets the pool's shared answer for that blocker, and a pool that
        closes for everyone with no quota to refuse anyone is sealed: see :meth:`sweep`)."""
        gate = pool.backfill.gate(end)
        if gate.open:
            return gate
        blocker = pool.backfill.reservation
        closed = pool.closed
        if closed is None or closed[0] is not blocker:
            who = f" job {blocker.job_id}" if blocker is not None else " an earlier job"
            message = (
                f"waits behind{who}, blocked higher in the queue of pool {pool.name} "
                "(strict order: no backfill)"
            )
            closed = pool.closed = (blocker, PendingInfo(PendingReason.PRIORITY, message))
            if self.sealed is None and pool.backfill.closes_all and self.ledger.admits_all:
                self.sealed = pool
        self.pending[job.id] = closed[1]
        return None

    def place(
        self,
        job: Job,
        pool: PoolState,
        shape: Shape,
        end: float | None,
        gate: Gate,
        *,
        where: Where,
    ) -> bool:
        """Step 4: start ``job`` if it fits where the gate lets it (``True``: started, or
        refused by the quota check on the memory it really gets); ``False`` when it does not
        fit: it is blocked."""
        target = self.target(pool, gate.shadow)
        placed = self.try_place(
            pool, target, shape, job.spec.replicas, long=gate.shadow is not None, where=where
        )
        if placed is None:
            return False
        memory = sum((p.shape.memory_mib or 0) * p.shape.count for p in placed)
        final = self.ledger.check(job, job.spec.total_gpu_milli, memory)
        if not final.admitted:
            release_all(target, placed)
            pool.epoch += 1
            assert final.reason is not None
            self.wait(job, final.reason, final.message)
            return True
        if target is not pool.live:
            allocate_all(pool.live, placed)
        elif pool.both is not None:
            self.refresh_both(pool, placed)
        pool.backfill.started(placed, end)
        self.ledger.commit(job.tenant, pool.name, job.spec.total_gpu_milli, memory)
        self.record_start(job, placed, final.standing is Standing.BORROWING)
        held = pool.live.held_shape  # a release gives back the slice and its context headroom
        self.started.extend(Release(end, held(p.shape, p.choice), p.choice) for p in placed)
        return True

    def place_shortened(self, job: Job, pool: PoolState, shape: Shape, where: Where) -> bool:
        """Step 4 again for a job with ``--time-min`` that the reservation held back: with
        the longest limit that ends before the reserved start (:func:`shortened_limit`); its
        start then carries that limit. ``False``: no such limit, or it does not fit."""
        limit = shortened_limit(job.spec, pool.backfill.reservation, self.now)
        if limit is None:
            return False
        end = self.now + limit
        gate = pool.backfill.gate(end)
        if not gate.open or gate.shadow is not None:
            return False
        count = len(self.starts)
        if not self.place(job, pool, shape, end, gate, where=where):
            return False
        if len(self.starts) > count:
            self.starts[-1] = replace(self.starts[-1], time_limit_s=limit)
        return True

    def target(self, pool: PoolState, shadow: CapacityArrays | None) -> CapacityArrays:
        """Where a job is placed: the live arrays, or where live and shadow both have room.

        The intersection is built once per reservation and kept up to date: a job placed on it
        is also allocated on live and shadow (``min(a - x, b - x) = min(a, b) - x``); a job
        placed on live only refreshes the rows it touched.
        """
        if shadow is None:
            return pool.live
        if pool.both is None or pool.both_of is not shadow:
            pool.both = intersect(pool.live, shadow)
            pool.both_of = shadow
        return pool.both

    def refresh_both(self, pool: PoolState, placed: tuple[Placed, ...]) -> None:
        both, live, shadow = pool.both, pool.live, pool.both_of
        assert both is not None
        assert shadow is not None
        for n in {p.choice.node for p in placed}:
            both.free_milli[n] = np.minimum(live.free_milli[n], shadow.free_milli[n])
            both.free_mem[n] = np.minimum(live.free_mem[n], shadow.free_mem[n])
            both.cpu_free[n] = min(live.cpu_free[n], shadow.cpu_free[n])
            both.host_mem_free[n] = min(live.host_mem_free[n], shadow.host_mem_free[n])

    def try_place(
        self,
        pool: PoolState,
        target: CapacityArrays,
        shape: Shape,
        replicas: int,
        *,
        long: bool,
        where: Where,
    ) -> tuple[Placed, ...] | None:
        """Place on ``target`` (allocated there), or ``None``; failures are cached per shape."""
        key = (shape, replicas, long, where.key)
        if pool.failed.get(key) == pool.epoch:
            return None
        placed = place_job(target, pool.policy, shape, replicas, where.nodes)
        if placed is None:
            pool.failed[key] = pool.epoch
        return placed

    def record_start(self, job: Job, placed: tuple[Placed, ...], borrowing: bool) -> None:
        names = self.capacity.arrays.node_names
        replicas = tuple(
            ReplicaStart(
                rank=rank,
                node=names[p.choice.node],
                devices=self.capacity.uuids(p.choice),
                milli_per_device=p.shape.milli if p.shape.count else 0,
                memory_per_device_mib=(p.shape.memory_mib or 0) if p.shape.count else 0,
                cpu_milli=p.shape.cpu_milli,
                host_memory_mib=p.shape.host_memory_mib,
            )
            for rank, p in enumerate(placed)
        )
        self.starts.append(Start(job.id, job.tenant, job.spec.pool, replicas, borrowing))

    def decision(self, ordering: Ordering) -> Decision:
        reservations: list[Reservation] = [
            p.backfill.reservation
            for _, p in sorted(self.pools.items())
            if p.backfill.reservation is not None
        ]
        return Decision(
            starts=tuple(self.starts),
            preemptions=tuple(self.preemptions),
            reservations=tuple(reservations),
            pending=MappingProxyType(self.pending),  # the cycle is over: nothing changes it
            priorities=ordering.factors,
            order=ordering.ids,
            unfit=tuple(self.unfit),
        )


def schedule(
    snapshot: ClusterSnapshot,
    config: SchedulerConfig | None = None,
    memo: SchedulerMemo | None = None,
) -> Decision:
    """Decide what to start, stop and reserve for ``snapshot`` (pure and deterministic).

    ``memo`` is what the caller's earlier cycles remembered (:mod:`~gpupool.scheduling.memo`):
    a caller that runs cycles one after another keeps one and passes it each time. ``None``:
    a fresh memo for this call only. The decision is the same either way.
    """
    config = config or SchedulerConfig()
    cycle = _Cycle(snapshot, config, SchedulerMemo() if memo is None else memo)
    ranked = make_ordering(config.ordering).rank(snapshot, config, cycle.capacity)
    cycle.run(ranked)
    return cycle.decision(ranked)
