"""Step 5 of a scheduling cycle: a job that passed its quota and its pool's gate but does not
fit.

:class:`BlockedJobs` is mixed into the cycle (:class:`gpupool.scheduling.scheduler._Cycle`);
:meth:`~BlockedJobs.blocked` decides what such a job gets, in this order: the victims already
stopping for it (it waits for them); **preemption** of lower-priority or borrowing jobs when it
is in quota (:mod:`~gpupool.scheduling.preemption`: the plan's room is held for it until its
victims are gone); a job that fits now only by taking what the pool's reserved job is
promised waits for that reservation; a job that fits nowhere in its pool even empty is
*unfit* (unless nodes of the pool are drained or down that could hold it, or no node has the
features its ``--constraint`` asks for); otherwise the first blocked job of a pool gets the
**reservation** (:mod:`~gpupool.scheduling.reservation`) and every other one a reason and an
estimated start, with the reclaim of its guarantee from borrowers still exempt from it when
that is what it waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpupool.domain.jobs import Job
from gpupool.domain.nodes import DeviceHealth, allowed_model
from gpupool.scheduling.admission import Standing
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.constraints import bad_constraint_message, node_allowed
from gpupool.scheduling.cyclestate import CycleState, PoolState, Where
from gpupool.scheduling.decision import PendingReason, Preemption, PreemptionReason
from gpupool.scheduling.fit import diagnose, place_job, release_all
from gpupool.scheduling.placement.base import CapacityArrays, Shape
from gpupool.scheduling.preemption import (
    Candidate,
    ExemptReclaim,
    Request,
    candidates_for,
    exempt_reclaim,
    hold,
    preemptible_jobs,
    victim_reason,
)
from gpupool.scheduling.reservation import Blocked, Timeline, fits_check


class BlockedJobs(CycleState):
    """See the module docstring."""

    def blocked(
        self,
        job: Job,
        pool: PoolState,
        shape: Shape,
        replicas: int,
        *,
        standing: Standing,
        shadow: CapacityArrays | None,
        where: Where,
    ) -> None:
        """Step 5: decide what blocked ``job`` gets (see the module docstring)."""
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

    def no_node_has_features(self, job: Job, pool: PoolState) -> bool:
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

    def unavailable_nodes(self, job: Job, pool: PoolState) -> list[str]:
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
        self, job: Job, pool: PoolState, shape: Shape, replicas: int, where: Where
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
            self.exempt_victims = self.preemptible(replace(config, preempt_exempt_s=0.0))
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

    def preemptible(self, config: SchedulerConfig) -> dict[str, tuple[Candidate, ...]]:
        """The running jobs ``config`` lets a cycle preempt, by pool (built on first need)."""
        return preemptible_jobs(
            self.snapshot.running_by_job.items(),
            capacity=self.capacity,
            # Who borrows is fixed when the ledger opens (commits do not change it).
            borrowing={j for j in self.snapshot.running_by_job if self.ledger.is_borrowing(j)},
            now=self.now,
            config=config,
        )

    def _tl(self, pool: PoolState) -> Callable[[], Timeline]:
        return lambda: self.timeline(pool)

    def estimate(self, pool: PoolState, shape: Shape, replicas: int, where: Where) -> float | None:
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
        self, job: Job, pool: PoolState, shape: Shape, replicas: int, where: Where
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
            self.victims = self.preemptible(config)
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
