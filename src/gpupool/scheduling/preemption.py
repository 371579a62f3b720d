"""Stage 4, preemption: stop the cheapest set of running jobs that lets a blocked job place.

Who may preempt: a blocked job that is *in-quota* (see :mod:`gpupool.scheduling.admission`).
Borrowing jobs use idle capacity only and never preempt.

Who may be a **victim** of job ``J`` (all must hold):

- it is preemptible, in ``J``'s pool, not already stopping, and not chosen for another job in
  this cycle;
- it has run at least ``preempt_exempt_s`` (anti-loop, below);
- it has **strictly lower priority** than ``J`` (reason ``Priority``), or it **borrows** and
  ``J`` reclaims its own guarantee: ``J`` is in-quota under a managed quota and the victim
  belongs to another tenant (reason ``Reclaim``; here the victim's priority does not matter).

**Cheapest set** (stage ``cheapest``): victims are whole jobs (every replica of a gang). They are
tried in cost order: borrowers first, then lower priority, then less work lost since the last
checkpoint, then later start, then job id. For a one-replica job every node is tried: victims on
that node are added in cost order until the job fits there; the sets found are compared by
(number of victims, number of non-borrowers, highest victim priority, work lost). For a gang,
victims are added in cost order until the whole gang places, then each is dropped again if the
gang still places without it. Either way the winning set is verified on a copy of the arrays
with the pool's real policy: a preemption always lets its job place.

**No loops**: a victim's preemptor outranks it strictly, or reclaims a guarantee the victim's
tenant does not have, so no two jobs can preempt each other in turn; a job that restarted is
exempt for ``preempt_exempt_s``, so it is not preempted again straight away; a job waiting for its
victims to stop never preempts more; jobs started or chosen in a cycle are never victims in it.

Stage ``none`` never preempts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Protocol

import numpy as np

from gpupool.domain.errors import InvalidValue
from gpupool.domain.jobs import Job
from gpupool.scheduling.capacity import ClusterCapacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PreemptionReason
from gpupool.scheduling.fit import Placed, allocate_all, place_job, release_all
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    PlacementPolicy,
    Shape,
)
from gpupool.scheduling.snapshot import RunningReplica


@dataclass(frozen=True)
class Candidate:
    """A running job that may be stopped for the job being considered."""

    job_id: str
    tenant: str
    priority: int
    borrowing: bool
    work_lost_s: float
    start_time: float
    held: tuple[tuple[Shape, Choice], ...]  # what each replica holds

    @property
    def cost(self) -> tuple[int, int, float, float, str]:
        return (
            0 if self.borrowing else 1,
            self.priority,
            self.work_lost_s,
            -self.start_time,
            self.job_id,
        )

    @cached_property
    def nodes(self) -> frozenset[int]:
        return frozenset(c.node for _, c in self.held)

    def release_on(self, capacity: CapacityArrays) -> None:
        for shape, choice in self.held:
            capacity.release(shape, choice)

    def take_on(self, capacity: CapacityArrays) -> None:
        for shape, choice in self.held:
            capacity.cpu_free[choice.node] -= shape.cpu_milli
            capacity.host_mem_free[choice.node] -= shape.host_memory_mib
            for s in choice.slots:
                capacity.free_milli[choice.node, s] -= shape.milli
                capacity.free_mem[choice.node, s] -= shape.memory_mib or 0


@dataclass(frozen=True)
class Request:
    """A blocked in-quota job asking for room."""

    job: Job
    shape: Shape
    replicas: int
    live: CapacityArrays  # the pool's live view (not modified)
    nodes: BoolArray  # node rows of the pool
    policy: PlacementPolicy
    candidates: tuple[Candidate, ...]  # eligible victims, any order
    max_victims: int


@dataclass(frozen=True)
class Plan:
    """Victims to stop and where the job goes once they are gone (verified)."""

    victims: tuple[Candidate, ...]
    placed: tuple[Placed, ...]


class PreemptionStage(Protocol):
    """Chooses victims.

    Contract: :meth:`plan` returns ``None`` or a plan whose victims all come from
    ``request.candidates`` and after whose release ``request.job`` places (``placed``); it does
    not modify ``request.live``.
    """

    name: ClassVar[str]

    def plan(self, request: Request) -> Plan | None: ...


def preemptible_jobs(
    running: Iterable[tuple[str, tuple[RunningReplica, ...]]],
    *,
    capacity: ClusterCapacity,
    borrowing: set[str],
    now: float,
    config: SchedulerConfig,
) -> dict[str, tuple[Candidate, ...]]:
    """Per pool, the running jobs that could be a victim of *some* job this cycle, cheapest first.

    Built once per cycle; :func:`candidates_for` narrows it down for one job.
    """
    out: dict[str, list[Candidate]] = {}
    exempt_s = config.preempt_exempt_s
    held_by = capacity.held_by
    for job_id, replicas in running:
        first = replicas[0]
        if now - first.start_time < exempt_s:
            continue
        if len(replicas) == 1:  # the common case, without generator overhead
            if not first.preemptible or first.stopping:
                continue
            one = held_by(first)
            if one is None:
                continue
            held: tuple[tuple[Shape, Choice], ...] = (one,)
            priority = first.priority
            work_lost = first.work_since_checkpoint(now)
        else:
            if not all(r.preemptible for r in replicas) or any(r.stopping for r in replicas):
                continue
            held = tuple(found for r in replicas if (found := held_by(r)) is not None)
            if not held:
                continue
            priority = max(r.priority for r in replicas)
            work_lost = max(r.work_since_checkpoint(now) for r in replicas)
        out.setdefault(first.pool, []).append(
            Candidate(
                job_id=job_id,
                tenant=first.tenant,
                priority=priority,
                borrowing=job_id in borrowing,
                work_lost_s=work_lost,
                start_time=first.start_time,
                held=held,
            )
        )
    return {pool: tuple(sorted(c, key=_cost)) for pool, c in out.items()}


def _cost(candidate: Candidate) -> tuple[int, int, float, float, str]:
    return candidate.cost


def victim_reason(
    job: Job, victim: Candidate, *, in_quota_managed: bool
) -> PreemptionReason | None:
    """Why ``victim`` may be stopped for ``job``, or ``None`` when it may not."""
    if victim.priority < job.priority:
        return PreemptionReason.PRIORITY
    if in_quota_managed and victim.borrowing and victim.tenant != job.tenant:
        return PreemptionReason.RECLAIM
    return None


def candidates_for(
    job: Job,
    pool_jobs: tuple[Candidate, ...],
    *,
    in_quota_managed: bool,
    taken: set[str],
) -> tuple[Candidate, ...]:
    """The running jobs that may be stopped for ``job`` (see the module docstring), cheapest
    first."""
    return tuple(
        c
        for c in pool_jobs
        if c.job_id not in taken
        and c.job_id != job.id
        and victim_reason(job, c, in_quota_managed=in_quota_managed) is not None
    )


@dataclass(frozen=True)
class ExemptReclaim:
    """When a blocked in-quota job can reclaim its guarantee from borrowers still exempt.

    ``at``: the first time at which the borrowers whose exemption has run out by then, released
    together, let the job place; ``victims``: those borrowers (job ids) and their tenants."""

    at: float
    victims: tuple[str, ...]
    tenants: tuple[str, ...]


def exempt_reclaim(
    job: Job,
    exempt: tuple[Candidate, ...],
    *,
    live: CapacityArrays,
    policy: PlacementPolicy,
    shape: Shape,
    replicas: int,
    nodes: BoolArray,
    exempt_s: float,
) -> ExemptReclaim | None:
    """For ``job`` (in-quota under a managed quota, blocked, nothing to preempt now): the
    borrowers of other tenants in ``exempt`` (every preemptible job of the pool, exemption
    ignored) that are still within their first ``exempt_s`` seconds, released in the order their
    exemption ends until the job places. ``None`` when no such set lets it place."""
    mine = sorted(
        (c for c in exempt if c.borrowing and c.tenant != job.tenant and c.job_id != job.id),
        key=lambda c: (c.start_time, c.job_id),
    )
    trial = live.copy()
    taken: list[Candidate] = []
    for c in mine:
        c.release_on(trial)
        taken.append(c)
        if place_job(trial.copy(), policy, shape, replicas, nodes) is not None:
            return ExemptReclaim(
                at=c.start_time + exempt_s,
                victims=tuple(v.job_id for v in taken),
                tenants=tuple(sorted({v.tenant for v in taken})),
            )
    return None


def _set_cost(victims: tuple[Candidate, ...]) -> tuple[int, int, int, float]:
    return (
        len(victims),
        sum(1 for v in victims if not v.borrowing),
        max(v.priority for v in victims),
        sum(v.work_lost_s for v in victims),
    )


def _without(live: CapacityArrays, victims: tuple[Candidate, ...]) -> CapacityArrays:
    """A copy of ``live`` with every one of ``victims`` released (vectorised)."""
    out = live.copy()
    rows: list[int] = []
    slots: list[int] = []
    milli: list[int] = []
    mem: list[int] = []
    node_rows: list[int] = []
    cpu: list[int] = []
    host: list[int] = []
    for v in victims:
        for shape, choice in v.held:
            node_rows.append(choice.node)
            cpu.append(shape.cpu_milli)
            host.append(shape.host_memory_mib)
            for slot in choice.slots:
                rows.append(choice.node)
                slots.append(slot)
                milli.append(shape.milli)
                mem.append(shape.memory_mib or 0)
    np.add.at(out.free_milli, (rows, slots), milli)
    np.add.at(out.free_mem, (rows, slots), mem)
    np.add.at(out.cpu_free, node_rows, cpu)
    np.add.at(out.host_mem_free, node_rows, host)
    return out


def _verify(request: Request, victims: tuple[Candidate, ...]) -> Plan | None:
    trial = request.live.copy()
    for v in victims:
        v.release_on(trial)
    placed = place_job(trial, request.policy, request.shape, request.replicas, request.nodes)
    return None if placed is None else Plan(victims, placed)


class CheapestVictims:
    """The ``cheapest`` stage (see the module docstring)."""

    name: ClassVar[str] = "cheapest"

    def plan(self, request: Request) -> Plan | None:
        cands = request.candidates
        if not cands:
            return None
        work = request.live.copy()
        if request.replicas == 1:
            best = self._per_node(request, work)
        else:
            best = self._greedy(request, work)
        return None if best is None else _verify(request, best)

    def _per_node(self, request: Request, work: CapacityArrays) -> tuple[Candidate, ...] | None:
        shape = request.shape
        by_node: dict[int, list[Candidate]] = {}
        for c in request.candidates:
            for n in c.nodes:
                by_node.setdefault(n, []).append(c)
        # Only nodes where the job would fit with every candidate gone are worth a closer look.
        hopeful = _without(work, request.candidates).feasible_nodes(shape) & request.nodes
        # A node's set always holds its cheapest candidate, so its cost is at least that
        # candidate's alone: visit nodes in that order and stop once no node can do better.
        nodes = sorted((n for n in by_node if hopeful[n]), key=lambda n: (by_node[n][0].cost, n))
        best: tuple[Candidate, ...] | None = None
        for node in nodes:
            if best is not None and _set_cost((by_node[node][0],)) >= _set_cost(best):
                break
            chosen: list[Candidate] = []
            for c in by_node[node][: request.max_victims]:
                c.release_on(work)
                chosen.append(c)
                if work.fits_on_node(shape, node):
                    break
            fits = work.fits_on_node(shape, node)
            for c in reversed(chosen):
                c.take_on(work)
            if fits:
                found = tuple(chosen)
                if best is None or _set_cost(found) < _set_cost(best):
                    best = found
        return best

    def _greedy(self, request: Request, work: CapacityArrays) -> tuple[Candidate, ...] | None:
        def places() -> bool:
            placed = place_job(work, request.policy, request.shape, request.replicas, request.nodes)
            if placed is None:
                return False
            release_all(work, placed)
            return True

        chosen: list[Candidate] = []
        for c in request.candidates[: request.max_victims]:
            c.release_on(work)
            chosen.append(c)
            if places():
                break
        else:
            return None
        # Drop every victim the gang can do without, most expensive first.
        for c in sorted(chosen, key=lambda v: v.cost, reverse=True):
            c.take_on(work)
            if places():
                chosen.remove(c)
            else:
                c.release_on(work)
        return tuple(chosen)


def hold(live: CapacityArrays, plan: Plan) -> None:
    """Apply ``plan`` to the live arrays: the job's room is taken, and nothing else is freed.

    The victims keep running until they have stopped, so what they hold beyond the job's needs
    must not go to anybody else in this cycle: on their nodes, free capacity ends at most what
    it was before the preemption.
    """
    rows = sorted({n for v in plan.victims for n in v.nodes})
    before = [
        (
            live.free_milli[n].copy(),
            live.free_mem[n].copy(),
            live.cpu_free[n],
            live.host_mem_free[n],
        )
        for n in rows
    ]
    for victim in plan.victims:
        victim.release_on(live)
    allocate_all(live, plan.placed)
    for n, (milli, mem, cpu, host) in zip(rows, before, strict=True):
        live.free_milli[n] = live.free_milli[n].clip(max=milli)
        live.free_mem[n] = live.free_mem[n].clip(max=mem)
        live.cpu_free[n] = min(int(live.cpu_free[n]), int(cpu))
        live.host_mem_free[n] = min(int(live.host_mem_free[n]), int(host))


class NoPreemption:
    """Never preempt."""

    name: ClassVar[str] = "none"

    def plan(self, request: Request) -> Plan | None:
        return None


#: name -> preemption stage.
PREEMPTIONS: dict[str, type[PreemptionStage]] = {
    "cheapest": CheapestVictims,
    "none": NoPreemption,
}


def make_preemption(name: str) -> PreemptionStage:
    """The preemption stage registered as ``name``."""
    found = PREEMPTIONS.get(name)
    if found is None:
        raise InvalidValue(
            f"preemption {name!r} is not known: use one of {', '.join(sorted(PREEMPTIONS))}",
            field="preemption",
        )
    return found()
