"""The scheduler: a pure function from a frozen cluster snapshot to a decision.

    from gpupool.scheduling import ClusterSnapshot, SchedulerConfig, SchedulerMemo, schedule

    memo = SchedulerMemo()  # one per caller that runs cycles one after another
    decision = schedule(snapshot, SchedulerConfig(), memo)

Modules, in the order a cycle uses them: ``snapshot`` (the input), ``memo`` (what the caller's
earlier cycles remembered; ``layout`` the static arrays it keeps), ``capacity`` (free capacity
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
from gpupool.scheduling.memo import SchedulerMemo
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
    "SchedulerMemo",
    "SizeDirection",
    "Start",
    "explain_job",
    "schedule",
]
