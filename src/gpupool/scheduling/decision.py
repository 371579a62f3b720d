"""The scheduler's output: what to start, what to stop, and why everything else waits.

The caller commits a :class:`Decision` (in one transaction) and dispatches it; the scheduler
itself changes nothing.

Words:

- a **start** (:class:`Start`) places every replica of one job; a gang's replicas carry their
  rank (``ReplicaStart.rank``), and a gang is always started whole.
- a **preemption** (:class:`Preemption`) stops a running job (all its replicas) to make room for
  a pending one. The pending job does not start in the same cycle: it waits
  (``WaitingForPreemption``) until its victims have stopped, and the room is kept for it.
- a **reservation** (:class:`Reservation`) promises the first blocked job of a pool its earliest
  start; later jobs start only when they do not delay it (EASY backfill). The reserved job keeps
  the reason it cannot start now (``InsufficientGpu``...) and gets the reserved start as its
  estimate; a later job that would fit but would delay it waits with ``WaitingForReservation``.
- every job left pending has a :class:`PendingInfo`: a machine-readable :class:`PendingReason`,
  a sentence for people and an estimated start time (``None`` when it cannot be estimated).
- :class:`PriorityFactors` is the ordering stage's factor table for one job (``explain``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class PendingReason(enum.Enum):
    """Why a job is still pending. Values are the names users and scripts see."""

    HELD = "Held"  # a user or admin holds it
    NOT_ELIGIBLE = "NotEligible"  # its eligible time is in the future
    POOL_UNKNOWN = "PoolUnknown"  # it names a pool that does not exist
    QUOTA_EXCEEDED = "QuotaExceeded"  # starting it would pass its tenant's limit in the pool
    BUDGET_EXHAUSTED = "BudgetExhausted"  # its tenant spent the pool's GPU-hour budget
    NO_DEVICE_OF_TYPE = "NoDeviceOfType"  # no usable device of an allowed GPU type in the pool
    TOO_LARGE = "TooLarge"  # it would not fit even on an empty pool
    INSUFFICIENT_GPU = "InsufficientGpu"  # not enough free GPU share right now
    INSUFFICIENT_MEMORY = "InsufficientMemory"  # GPU share free, GPU memory not
    INSUFFICIENT_CPU = "InsufficientCpu"  # GPUs free, host CPUs not
    INSUFFICIENT_HOST_MEMORY = "InsufficientHostMemory"  # GPUs and CPUs free, host memory not
    GANG_INCOMPLETE = "GangIncomplete"  # some replicas of the gang fit, not all
    WAITING_FOR_RESERVATION = "WaitingForReservation"  # it fits, but would delay the reservation
    WAITING_FOR_PREEMPTION = "WaitingForPreemption"  # victims are stopping to make room for it
    PRIORITY = "Priority"  # strict order: a job ahead of it in its pool is blocked
    CYCLE_LIMIT = "CycleLimit"  # not considered this cycle (``max_jobs_per_cycle``)
    BEGIN_TIME = "BeginTime"  # submitted with a begin time still to come (sbatch --begin)
    REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"  # it fits only nodes that are drained or down now
    BAD_CONSTRAINTS = "BadConstraints"  # no node of its pool has the features it asks for
    # Given by the control plane before a cycle, never by the scheduler (a job waiting on
    # other jobs is not in its snapshot): see control/machinery/dependencies.py.
    DEPENDENCY = "Dependency"  # its dependency on other jobs is not met yet
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"  # it never can be: the job ends
    ARRAY_TASK_LIMIT = "JobArrayTaskLimit"  # its array's throttle (--array ...%N) is reached


class PreemptionReason(enum.Enum):
    """Why a victim is stopped."""

    PRIORITY = "Priority"  # a job of strictly higher priority needs the room
    RECLAIM = "Reclaim"  # an in-quota job takes back capacity the victim borrowed


@dataclass(frozen=True)
class ReplicaStart:
    """Where one replica goes: ``devices`` are UUIDs on ``node``, each with the same slice."""

    rank: int
    node: str
    devices: tuple[str, ...]
    milli_per_device: int
    memory_per_device_mib: int
    cpu_milli: int
    host_memory_mib: int


@dataclass(frozen=True)
class Start:
    """Start every replica of ``job_id``. ``borrowing`` marks a start above the guarantee."""

    job_id: str
    tenant: str
    pool: str
    replicas: tuple[ReplicaStart, ...]
    borrowing: bool = False
    #: ``--time-min``: the time limit backfill started it with (``None``: its own; see
    #: :mod:`gpupool.scheduling.timemin`).
    time_limit_s: float | None = None

    @property
    def gpu_milli(self) -> int:
        return sum(r.milli_per_device * len(r.devices) for r in self.replicas)


@dataclass(frozen=True)
class Preemption:
    """Stop ``victim`` (every replica) so that ``for_job`` can place."""

    victim: str
    for_job: str
    reason: PreemptionReason
    message: str


@dataclass(frozen=True)
class Reservation:
    """The pool's first blocked job is promised ``nodes`` from ``start_time``.

    ``start_time`` ``None`` means the start depends on running jobs with no known end; the
    devices are still kept free of longer backfill.
    """

    job_id: str
    pool: str
    start_time: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class PendingInfo:
    """Why a job waits, for machines (``reason``) and people (``message``).

    ``estimated_start`` is the earliest time the job is expected to fit, from the expected
    ends of running jobs; ``None`` when unknown (no end known, quota or hold).
    """

    reason: PendingReason
    message: str
    estimated_start: float | None = None


@dataclass(frozen=True)
class Factor:
    """One row of a job's priority table: ``contribution = weight * value``."""

    name: str
    weight: float
    value: float
    meaning: str

    @property
    def contribution(self) -> float:
        return self.weight * self.value


@dataclass(frozen=True)
class PriorityFactors:
    """The ordering stage's factor table for one job; ``score`` is the sum of contributions.

    Stored as parallel tuples (one entry per factor) so that a cycle over thousands of jobs does
    not build thousands of row objects; :attr:`factors` gives the rows.
    """

    job_id: str
    values: tuple[float, ...] = ()
    names: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    meanings: tuple[str, ...] = ()

    @property
    def factors(self) -> tuple[Factor, ...]:
        return tuple(
            Factor(n, w, v, m)
            for n, w, v, m in zip(self.names, self.weights, self.values, self.meanings, strict=True)
        )

    @property
    def score(self) -> float:
        return sum(w * v for w, v in zip(self.weights, self.values, strict=True))


class NoFactors(Mapping[str, PriorityFactors]):
    """An empty factor table for each of ``ids``, for orderings without factors (``fifo``).

    Tables are made when looked up, so a cycle over a long queue builds none it is not asked for.
    """

    __slots__ = ("_ids", "_members")

    def __init__(self, ids: tuple[str, ...]) -> None:
        self._ids = ids
        self._members: frozenset[str] | None = None

    def __getitem__(self, job_id: str) -> PriorityFactors:
        if self._members is None:
            self._members = frozenset(self._ids)
        if job_id not in self._members:
            raise KeyError(job_id)
        return PriorityFactors(job_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def _frozen_map(mapping: Mapping[str, object]) -> Mapping[str, object]:
    """A read-only view: read-only mappings are kept, anything else is copied first."""
    if isinstance(mapping, MappingProxyType | NoFactors):
        return mapping
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Decision:
    """What one scheduling cycle decided.

    ``order`` is every pending job id in the order the cycle considered them; ``pending`` has an
    entry for every pending job that was not started (a job the snapshot also lists as running
    is left out: the caller's queue is stale there); ``priorities`` the factor table of every
    pending job; ``unfit`` the pending jobs whose reason says they fit nowhere in their pool even
    with nothing running (``TooLarge``, ``NoDeviceOfType``), in the order considered, so a caller
    that refuses such jobs need not read every reason.
    """

    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    pending: Mapping[str, PendingInfo] = field(default_factory=dict)
    priorities: Mapping[str, PriorityFactors] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    unfit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "pending", _frozen_map(self.pending))
        object.__setattr__(self, "priorities", _frozen_map(self.priorities))

    def start_of(self, job_id: str) -> Start | None:
        """The start of ``job_id`` in this decision, or ``None``."""
        return next((s for s in self.starts if s.job_id == job_id), None)

    def explain(self, job_id: str) -> PriorityFactors:
        """The priority factor table of a pending job (``KeyError`` for unknown ids)."""
        return self.priorities[job_id]

    @property
    def started_ids(self) -> frozenset[str]:
        return frozenset(s.job_id for s in self.starts)

    @property
    def victim_ids(self) -> frozenset[str]:
        return frozenset(p.victim for p in self.preemptions)
