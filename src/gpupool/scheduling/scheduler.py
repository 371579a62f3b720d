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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from types import MappingProxyType

import numpy as np

from gpupool.domain.jobs import Job
from gpupool.domain.nodes import DeviceHealth, allowed_model
from gpupool.scheduling.admission import Ledger, Standing, make_admission
from gpupool.scheduling.capacity import ClusterCapacity, build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.constraints import bad_constraint_message, node_allowed
from gpupool.scheduling.decision import (
    Decision,
    PendingInfo,
    PendingReason,
    Preemption,
    PreemptionReason,
    ReplicaStart,
    Reservation,
    Start,
)
from gpupool.scheduling.fit import Placed, allocate_all, diagnose, place_job, release_all
from gpupool.scheduling.learning import show_arrivals
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.ordering import Ordering, make_ordering
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    PlacementPolicy,
    PolicyOptions,
    Shape,
)
from gpupool.scheduling.placement.registry import make_policy
from gpupool.scheduling.preemption import (
    Candidate,
    ExemptReclaim,
    PreemptionStage,
    Request,
    candidates_for,
    exempt_reclaim,
    hold,
    make_preemption,
    preemptible_jobs,
    victim_reason,
)
from gpupool.scheduling.release import Release
from gpupool.scheduling.reservation import (
    Blocked,
    Gate,
    PoolBackfill,
    Timeline,
    fits_check,
    intersect,
    make_backfill,
    running_releases,
)
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.scheduling.timemin import shortened_limit

_ShapeKey = tuple[Shape, int]
#: A job's node restriction (``--nodelist``, ``--exclude``, ``--constraint``'s text or "");
#: ``()`` for none.
_NodeKey = tuple[tuple[str, ...], tuple[str, ...], str] | tuple[()]
_WhereKey = tuple[Shape, int, _NodeKey]


@dataclass(frozen=True)
class _Where:
    """The node rows of its pool a job may use, and the restriction they come from (part of
    every cache key, so a restricted job never shares an answer with an unrestricted one)."""

    nodes: BoolArray
    key: _NodeKey = ()


_HELD = attrgetter("held")
_ELIGIBLE = attrgetter("eligible_time")
_POOL = attrgetter("spec.pool")


@dataclass
class _Pool:
    """One pool's state during the cycle."""

    name: str
    live: CapacityArrays
    nodes: BoolArray
    policy: PlacementPolicy
    backfill: PoolBackfill
    epoch: int = 0  # bumped whenever capacity is given back (cached failures expire)
    failed: dict[tuple[Shape, int, bool, _NodeKey], int] = field(default_factory=dict)
    diagnosis: dict[_WhereKey, tuple[PendingReason, str]] = field(default_factory=dict)
    estimates: dict[_WhereKey, float | None] = field(default_factory=dict)
    # (nodelist, exclude) -> the pool's nodes a job restricted so may use (see _Cycle.where)
    node_masks: dict[_NodeKey, BoolArray] = field(default_factory=dict)
    timeline: Timeline | None = None
    # (shape, replicas, priority, tenant) that found no victims: capacity only shrinks and the
    # victim pool only narrows during a cycle, so they would find none again.
    preempt_failed: set[tuple[Shape, int, int, str, _NodeKey]] = field(default_factory=set)
    both: CapacityArrays | None = None  # live and shadow intersected (see _Cycle.target)
    both_of: CapacityArrays | None = None  # the shadow ``both`` was built from
    # The reservation the gate closed behind and the answer every job then gets (shared:
    # one message per pool and blocker, not one per waiting job).
    closed: tuple[Reservation | None, PendingInfo] | None = None


def _job_end(job: Job, now: float) -> float | None:
    spec = job.spec
    duration = (
        spec.expected_duration_s if spec.expected_duration_s is not None else spec.time_limit_s
    )
    return None if duration is None else now + duration


class _Cycle:
    """The working state of one call to :func:`schedule`."""

    def __init__(
        self, snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo
    ) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = snapshot.now
        self.capacity: ClusterCapacity = build_capacity(snapshot, memo)
        self.ledger: Ledger = make_admission(config.admission).open(snapshot, config)
        self.preemption: PreemptionStage = make_preemption(config.preemption)
        self.backfill = make_backfill(config.backfill)
        self.pools: dict[str, _Pool] = {}
        self.starts: list[Start] = []
        self.preemptions: list[Preemption] = []
        self.pending: dict[str, PendingInfo] = {}
        self.taken: set[str] = set()  # victims chosen this cycle
        self.preemptors = 0
        self.victims: dict[str, tuple[Candidate, ...]] | None = None  # built on first need
        # The same with the exemption ignored (for ExemptReclaim), built on first need.
        self.exempt_victims: dict[str, tuple[Candidate, ...]] | None = None
        self.stopping_for: dict[str, list[float]] = {}
        for r in snapshot.running:
            if r.preempted_for is not None:
                self.stopping_for.setdefault(r.preempted_for, []).append(r.grace_period_s)
        self.running_ids = set(snapshot.running_by_job)
        self.started: list[Release] = []  # what this cycle started, ending at its expected end
        # Pools in strict order behind a blocked job with no quota to refuse anyone: every later
        # job of theirs gets the pool's shared answer (see sweep).
        self.sealed: _Pool | None = None  # the first such pool of this cycle
        self.unfit: list[str] = []  # pending jobs that fit nowhere in their pool, even empty
        self._features: dict[str, tuple[str, ...]] | None = None  # see node_features

    # ----------------------------------------------------------------- helpers

    def pool(self, name: str) -> _Pool:
        found = self.pools.get(name)
        if found is None:
            pool = self.snapshot.pool_by_name[name]
            name_used = pool.placement
            if name_used == "default":
                name_used = self.config.default_placement
            policy = make_policy(name_used, PolicyOptions(seed=self.config.seed))
            found = _Pool(
                name=name,
                live=self.capacity.view(name),
                nodes=self.capacity.nodes_of(name),
                policy=policy,
                backfill=self.backfill.open(name, self.now),
            )
            self.pools[name] = found
        return found

    def shape_of(self, job: Job) -> Shape:
        return self.capacity.shape_for(job.spec.resources, job.spec.isolation.value)

    def wait(
        self, job: Job, reason: PendingReason, message: str, estimate: float | None = None
    ) -> None:
        self.pending[job.id] = PendingInfo(reason, message, estimate)

    def timeline(self, pool: _Pool) -> Timeline:
        if pool.timeline is None:
            releases = running_releases(
                self.capacity, self.snapshot.running_by_job, self.taken, self.now
            )
            releases.extend(self.started)
            pool.timeline = Timeline(pool.live, releases, self.now)
        return pool.timeline

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

    def sweep(self, sealed: _Pool, rest: tuple[Job, ...], ids: tuple[str, ...]) -> None:
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

    def where(self, job: Job, pool: _Pool) -> _Where:
        """The nodes of ``pool`` that ``job`` may use: all of them, or those its ``nodelist``
        names and its ``exclude`` does not (sbatch ``--nodelist`` / ``--exclude``), and whose
        features satisfy its ``constraint`` (``--constraint``, see :func:`node_allowed`)."""
        spec = job.spec
        if not spec.nodelist and not spec.exclude and spec.constraint is None:
            return _Where(pool.nodes)
        text = spec.constraint.text if spec.constraint is not None else ""
        key: _NodeKey = (spec.nodelist, spec.exclude, text)
        found = pool.node_masks.get(key)
        if found is None:
            features = self.node_features()
            allowed = np.fromiter(
                (node_allowed(spec, n, features) for n in self.capacity.arrays.node_names),
                dtype=np.bool_,
                count=len(self.capacity.arrays.node_names),
            )
            found = pool.node_masks[key] = pool.nodes & allowed
        return _Where(found, key)

    def node_features(self) -> Mapping[str, tuple[str, ...]]:
        """Each node's features (``gpupool agent --feature``), read once per cycle."""
        if self._features is None:
            self._features = {n.name: n.features for n in self.snapshot.nodes}
        return self._features

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

    def behind_closed_gate(self, job: Job, pool: _Pool) -> bool:
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

    def gate(self, job: Job, pool: _Pool, end: float | None) -> Gate | None:
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
        self, job: Job, pool: _Pool, shape: Shape, end: float | None, gate: Gate, *, where: _Where
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

    def place_shortened(self, job: Job, pool: _Pool, shape: Shape, where: _Where) -> bool:
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

    def target(self, pool: _Pool, shadow: CapacityArrays | None) -> CapacityArrays:
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

    def refresh_both(self, pool: _Pool, placed: tuple[Placed, ...]) -> None:
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
        pool: _Pool,
        target: CapacityArrays,
        shape: Shape,
        replicas: int,
        *,
        long: bool,
        where: _Where,
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

    # ----------------------------------------------------------------- blocked jobs

    def blocked(
        self,
        job: Job,
        pool: _Pool,
        shape: Shape,
        replicas: int,
        *,
        standing: Standing,
        shadow: CapacityArrays | None,
        where: _Where,
    ) -> None:
        graces = self.stopping_for.get(job.id)
        if graces:
            self.wait(
                job,
                PendingReason.WAITING_FOR_PREEMPTION,
                f"{len(graces)} replica(s) are stopping to make room for it",
                self.now + max(graces),
            )
            return
        if standing is Standing.IN_QUOTA and self.try_preempt(job, pool, shape, replicas, where):
            return
        key = (shape, replicas, where.key)
        if shadow is not None:
            # It may fit now, but only by taking what the reserved job is promised.
            reservation = pool.backfill.reservation
            trial = place_job(pool.live, pool.policy, shape, replicas, where.nodes)
            if trial is not None and reservation is not None:
                release_all(pool.live, trial)
                when = reservation.start_time
                at = "when its devices free up" if when is None else f"at t={when:.0f}"
                self.wait(
                    job,
                    PendingReason.WAITING_FOR_RESERVATION,
                    f"it fits now, but would delay job {reservation.job_id}, reserved to start "
                    f"{at} in pool {pool.name}; give it a shorter time limit to backfill",
                    when,
                )
                return
        found = pool.diagnosis.get(key)
        if found is None:
            found = diagnose(
                pool.live,
                self.capacity.empty_view(pool.name),
                shape,
                replicas,
                where.nodes,
                pool=pool.name,
            )
            pool.diagnosis[key] = found
        reason, message = found
        if reason in (PendingReason.TOO_LARGE, PendingReason.NO_DEVICE_OF_TYPE):
            away = self.unavailable_nodes(job, pool)
            if not away and self.no_node_has_features(job, pool):
                return
            if away:
                self.wait(
                    job,
                    PendingReason.REQ_NODE_NOT_AVAIL,
                    f"no available node of pool {pool.name} can hold it, and node(s) "
                    f"{', '.join(away)} of the pool are not available: it may start when they "
                    "are back (an operator resumes a drained node with gpupool resume NODE)",
                )
                return
            self.wait(job, reason, message)
            self.unfit.append(job.id)
            return
        reclaim = (
            self.exempt_reclaim(job, pool, shape, replicas, where)
            if standing is Standing.IN_QUOTA
            else None
        )
        if reclaim is not None:
            wait_s = reclaim.at - self.now
            message = (
                f"{message}; tenant {job.tenant}'s guaranteed share is held by borrowed job(s) "
                f"{', '.join(reclaim.victims)} of {', '.join(reclaim.tenants)}, exempt from "
                f"reclaim for their first {self.config.preempt_exempt_s:.0f} s: it reclaims "
                f"them in {wait_s:.0f} s (at t={reclaim.at:.0f}) unless running jobs end first"
            )
        made = pool.backfill.blocked(
            Blocked(job.id, pool.name, shape, replicas, where.nodes, pool.policy, self._tl(pool))
        )
        if made is not None:
            when = made.start_time
            at = "once running jobs with unknown end finish" if when is None else f"at t={when:.0f}"
            if reclaim is not None:
                when = reclaim.at if when is None else min(when, reclaim.at)
            self.wait(
                job,
                reason,
                f"{message}; first in line in pool {pool.name}, it has {', '.join(made.nodes)} "
                f"reserved {at} and later jobs only backfill around it",
                when,
            )
            return
        estimate = self.estimate(pool, shape, replicas, where)
        if reclaim is not None:
            estimate = reclaim.at if estimate is None else min(estimate, reclaim.at)
        self.wait(job, reason, message, estimate)

    def no_node_has_features(self, job: Job, pool: _Pool) -> bool:
        """When no node of ``pool`` satisfies ``job``'s ``--constraint`` (up or not): it waits
        with ``BadConstraints`` saying so, and True."""
        spec = job.spec
        if spec.constraint is None:
            return False
        features = self.node_features()
        on_pool = {d.node for d in self.snapshot.devices if d.pool == pool.name}
        nodes = [n for n in self.snapshot.nodes if n.name in on_pool]
        if any(spec.constraint.allows(features.get(n.name, ())) for n in nodes):
            return False
        self.wait(
            job, PendingReason.BAD_CONSTRAINTS, bad_constraint_message(spec, pool.name, nodes)
        )
        self.unfit.append(job.id)
        return True

    def unavailable_nodes(self, job: Job, pool: _Pool) -> list[str]:
        """The nodes of ``pool`` (within the job's ``nodelist``/``exclude``) that are drained,
        draining or down and could hold one of its replicas when back and empty, each with its
        state: ``n1 (drained)``."""
        spec, res = job.spec, job.spec.resources
        features = self.node_features()
        away = {
            n.name: n
            for n in self.snapshot.nodes
            if not n.schedulable and node_allowed(spec, n.name, features)
        }
        if not away:
            return []
        need = res.gpu_memory_mib or 0
        cards: dict[str, int] = {}
        for d in self.snapshot.devices:
            if (
                d.node in away
                and d.pool == pool.name
                and d.health is DeviceHealth.HEALTHY
                and allowed_model(d.model, res.gpu_types)
                and d.memory_mib >= need
            ):
                cards[d.node] = cards.get(d.node, 0) + 1
        return [
            f"{name} ({node.state.value})"
            for name, node in away.items()
            if (name in cards or res.device_count == 0)
            and cards.get(name, 0) >= res.device_count
            and node.cpu_milli >= res.cpu_milli
            and node.memory_mib >= res.host_memory_mib
        ]

    def exempt_reclaim(
        self, job: Job, pool: _Pool, shape: Shape, replicas: int, where: _Where
    ) -> ExemptReclaim | None:
        """When ``job`` (in-quota, blocked, nothing to preempt now) could reclaim its guarantee
        from other tenants' borrowers still in their first ``preempt_exempt_s`` seconds (see
        :func:`~gpupool.scheduling.preemption.exempt_reclaim`); ``None`` when that is not what
        it waits for."""
        config = self.config
        if (
            not config.preemption_enabled
            or config.preempt_exempt_s <= 0
            or self.snapshot.quota(job.tenant, pool.name) is None
        ):
            return None
        if self.exempt_victims is None:
            self.exempt_victims = preemptible_jobs(
                self.snapshot.running_by_job.items(),
                capacity=self.capacity,
                borrowing={j for j in self.snapshot.running_by_job if self.ledger.is_borrowing(j)},
                now=self.now,
                config=replace(config, preempt_exempt_s=0.0),
            )
        found = exempt_reclaim(
            job,
            self.exempt_victims.get(pool.name, ()),
            live=pool.live,
            policy=pool.policy,
            shape=shape,
            replicas=replicas,
            nodes=where.nodes,
            exempt_s=config.preempt_exempt_s,
        )
        return found if found is not None and found.at > self.now else None

    def _tl(self, pool: _Pool) -> Callable[[], Timeline]:
        return lambda: self.timeline(pool)

    def estimate(self, pool: _Pool, shape: Shape, replicas: int, where: _Where) -> float | None:
        key = (shape, replicas, where.key)
        if key in pool.estimates:
            return pool.estimates[key]
        timeline = self.timeline(pool)
        value = timeline.estimate(fits_check(pool.policy, shape, replicas, where.nodes))
        if value is not None and value <= self.now:
            # It does not fit now, so not before the next job ends.
            value = timeline.next_end
        pool.estimates[key] = value
        return value

    def try_preempt(
        self, job: Job, pool: _Pool, shape: Shape, replicas: int, where: _Where
    ) -> bool:
        config = self.config
        if (
            not config.preemption_enabled
            or self.preemptors >= config.max_preemptors_per_cycle
            or pool.backfill.reservation is not None
        ):
            return False
        failed_key = (shape, replicas, job.priority, job.tenant, where.key)
        if failed_key in pool.preempt_failed:
            return False
        if self.victims is None:
            self.victims = preemptible_jobs(
                self.snapshot.running_by_job.items(),
                capacity=self.capacity,
                # Who borrows is fixed when the ledger opens (commits do not change it).
                borrowing={j for j in self.snapshot.running_by_job if self.ledger.is_borrowing(j)},
                now=self.now,
                config=config,
            )
        managed = self.snapshot.quota(job.tenant, pool.name) is not None
        candidates = candidates_for(
            job, self.victims.get(pool.name, ()), in_quota_managed=managed, taken=self.taken
        )
        if not candidates:
            pool.preempt_failed.add(failed_key)
            return False
        self.preemptors += 1
        plan = self.preemption.plan(
            Request(
                job=job,
                shape=shape,
                replicas=replicas,
                live=pool.live,
                nodes=where.nodes,
                policy=pool.policy,
                candidates=candidates,
                max_victims=config.max_victims_per_job,
            )
        )
        if plan is None:
            pool.preempt_failed.add(failed_key)
            return False
        hold(pool.live, plan)
        graces = [0.0]
        for victim in plan.victims:
            self.taken.add(victim.job_id)
            replicas_of = self.snapshot.running_by_job[victim.job_id]
            graces.extend(r.grace_period_s for r in replicas_of)
            self.ledger.release(
                victim.tenant,
                pool.name,
                sum(r.gpu_milli for r in replicas_of),
                sum(r.gpu_memory_mib for r in replicas_of),
            )
            reason = victim_reason(job, victim, in_quota_managed=managed)
            assert reason is not None
            why = (
                f"job {job.id} (priority {job.priority}) outranks it (priority {victim.priority})"
                if reason is PreemptionReason.PRIORITY
                else f"tenant {job.tenant} reclaims its guaranteed share, which {victim.tenant} "
                "was borrowing"
            )
            self.preemptions.append(Preemption(victim.job_id, job.id, reason, why))
        memory = sum((p.shape.memory_mib or 0) * p.shape.count for p in plan.placed)
        self.ledger.commit(job.tenant, pool.name, job.spec.total_gpu_milli, memory)
        ids = ", ".join(v.job_id for v in plan.victims)
        self.wait(
            job,
            PendingReason.WAITING_FOR_PREEMPTION,
            f"preempting {ids} to make room; it starts when they have stopped",
            self.now + max(graces),
        )
        return True

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
