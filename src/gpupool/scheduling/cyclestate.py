"""The working state of one scheduling cycle: :class:`CycleState`, and per pool
:class:`PoolState`.

A cycle (:func:`gpupool.scheduling.scheduler.schedule`) builds the free capacity once from the
snapshot and updates it in place as it starts jobs; what it has decided so far (starts,
preemptions, pending reasons, victims taken) and what it has learnt that holds for the rest of
the cycle (per pool: shapes that found no room, no victims, their diagnosis and estimate, the
backfill timeline) live here. A job's node restriction (``--nodelist``, ``--exclude``,
``--constraint``) is part of every such cache key (:class:`Where`), so a restricted job never
shares an answer with an unrestricted one.

The cycle's steps are :class:`gpupool.scheduling.scheduler._Cycle` (skip, admit, gate, place)
and :class:`gpupool.scheduling.blocked.BlockedJobs` (a job that does not fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.domain.jobs import Job
from gpupool.scheduling.admission import Ledger, make_admission
from gpupool.scheduling.capacity import ClusterCapacity, build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingInfo, PendingReason, Preemption, Reservation, Start
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    PlacementPolicy,
    PolicyOptions,
    Shape,
)
from gpupool.scheduling.placement.registry import make_policy
from gpupool.scheduling.preemption import Candidate, PreemptionStage, make_preemption
from gpupool.scheduling.release import Release
from gpupool.scheduling.reservation import PoolBackfill, Timeline, make_backfill, running_releases
from gpupool.scheduling.snapshot import ClusterSnapshot

#: A job's node restriction (``--nodelist``, ``--exclude``, ``--constraint``'s text or "");
#: ``()`` for none.
NodeKey = tuple[tuple[str, ...], tuple[str, ...], str] | tuple[()]
WhereKey = tuple[Shape, int, NodeKey]


@dataclass(frozen=True)
class Where:
    """The node rows of its pool a job may use, and the restriction they come from (part of
    every cache key, so a restricted job never shares an answer with an unrestricted one)."""

    nodes: BoolArray
    key: NodeKey = ()


@dataclass
class PoolState:
    """One pool's state during the cycle."""

    name: str
    live: CapacityArrays
    nodes: BoolArray
    policy: PlacementPolicy
    backfill: PoolBackfill
    epoch: int = 0  # bumped whenever capacity is given back (cached failures expire)
    failed: dict[tuple[Shape, int, bool, NodeKey], int] = field(default_factory=dict)
    diagnosis: dict[WhereKey, tuple[PendingReason, str]] = field(default_factory=dict)
    estimates: dict[WhereKey, float | None] = field(default_factory=dict)
    # (nodelist, exclude) -> the pool's nodes a job restricted so may use (see _Cycle.where)
    node_masks: dict[NodeKey, BoolArray] = field(default_factory=dict)
    timeline: Timeline | None = None
    # (shape, replicas, priority, tenant) that found no victims: capacity only shrinks and the
    # victim pool only narrows during a cycle, so they would find none again.
    preempt_failed: set[tuple[Shape, int, int, str, NodeKey]] = field(default_factory=set)
    both: CapacityArrays | None = None  # live and shadow intersected (see _Cycle.target)
    both_of: CapacityArrays | None = None  # the shadow ``both`` was built from
    # The reservation the gate closed behind and the answer every job then gets (shared:
    # one message per pool and blocker, not one per waiting job).
    closed: tuple[Reservation | None, PendingInfo] | None = None


class CycleState:
    """The working state of one call to :func:`~gpupool.scheduling.scheduler.schedule`, and
    the helpers every step uses."""

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
        self.pools: dict[str, PoolState] = {}
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
        self.sealed: PoolState | None = None  # the first such pool of this cycle
        self.unfit: list[str] = []  # pending jobs that fit nowhere in their pool, even empty
        self._features: dict[str, tuple[str, ...]] | None = None  # see node_features

    # ----------------------------------------------------------------- helpers

    def pool(self, name: str) -> PoolState:
        found = self.pools.get(name)
        if found is None:
            pool = self.snapshot.pool_by_name[name]
            name_used = pool.placement
            if name_used == "default":
                name_used = self.config.default_placement
            policy = make_policy(name_used, PolicyOptions(seed=self.config.seed))
            found = PoolState(
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

    def timeline(self, pool: PoolState) -> Timeline:
        if pool.timeline is None:
            releases = running_releases(
                self.capacity, self.snapshot.running_by_job, self.taken, self.now
            )
            releases.extend(self.started)
            pool.timeline = Timeline(pool.live, releases, self.now)
        return pool.timeline

    def node_features(self) -> Mapping[str, tuple[str, ...]]:
        """Each node's features (``gpupool agent --feature``), read once per cycle."""
        if self._features is None:
            self._features = {n.name: n.features for n in self.snapshot.nodes}
        return self._features
