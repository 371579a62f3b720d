"""The scheduler: a pure function from a frozen cluster snapshot to a decision.

    from gpupool.scheduling import ClusterSnapshot, SchedulerConfig, schedule

    decision = schedule(snapshot, SchedulerConfig())

Modules, in the order a cycle uses them: ``snapshot`` (the input), ``capacity`` (free capacity
as numpy arrays), ``ordering``, ``admission``, ``fit`` and ``placement/`` (where replicas go),
``preemption``, ``reservation`` (backfill and estimates), ``decision`` (the output),
``scheduler`` (chains them) and ``explain`` (text for people). Nothing here performs I/O.
"""

from gpupool.scheduling.config import OrderingWeights, SchedulerConfig, SizeDirection
from gpupool.scheduling.decision import (
    Decision,
    Factor,
    PendingInfo,
    PendingReason,
    Preemption,
    PreemptionReason,
    PriorityFactors,
    ReplicaStart,
    Reservation,
    Start,
)
from gpupool.scheduling.explain import explain_job
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica

__all__ = [
    "ClusterSnapshot",
    "Decision",
    "Factor",
    "OrderingWeights",
    "PendingInfo",
    "PendingReason",
    "Preemption",
    "PreemptionReason",
    "PriorityFactors",
    "ReplicaStart",
    "Reservation",
    "RunningReplica",
    "SchedulerConfig",
    "SizeDirection",
    "Start",
    "explain_job",
    "schedule",
]
