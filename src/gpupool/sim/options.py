"""What a replay is told (:class:`ReplayOptions`, :class:`NodeFailure`) and what it gives back
(:class:`ReplayResult`). The loop itself is :mod:`gpupool.sim.replay`."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.sim.jobstate import JobOutcome
from gpupool.sim.recorder import Integrals, TimeSeries


@dataclass(frozen=True)
class NodeFailure:
    """Node ``node`` fails at ``at`` (seconds) and is back ``repair_s`` seconds later."""

    node: str
    at: float
    repair_s: float


@dataclass(frozen=True)
class ReplayOptions:
    """How the simulated cluster behaves around the scheduler.

    ``checkpoint_interval_s`` ``None`` means jobs never checkpoint. ``grace_period_s`` is how
    long a preempted job keeps its slices after the stop order. ``tick_s`` ``None`` switches
    the periodic tick off. ``usage_half_life_s`` is the fair-share usage decay.
    ``expected_duration`` says whether the scheduler is told each job's true run time
    (``oracle``) or nothing (``unknown``) for its start-time estimates and backfill.
    ``min_cycle_interval_s`` ``None`` runs one cycle per distinct event instant; a number
    coalesces cycles onto multiples of it (events still happen at their own times, jobs start
    at the next cycle), like a control loop with a minimum interval between cycles.
    """

    checkpoint_interval_s: float | None = 3600.0
    grace_period_s: float = 0.0
    tick_s: float | None = 300.0
    usage_half_life_s: float = 7 * 86400.0
    max_restarts: int = 1000
    expected_duration: str = "oracle"
    failures: tuple[NodeFailure, ...] = ()
    min_cycle_interval_s: float | None = None
    max_cycles_per_instant: int = 64

    def __post_init__(self) -> None:
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError("checkpoint interval must be above 0 seconds, or None for never")
        if self.min_cycle_interval_s is not None and self.min_cycle_interval_s <= 0:
            raise ValueError("the minimum cycle interval must be above 0 seconds, or None")
        if self.tick_s is not None and self.tick_s <= 0:
            raise ValueError("tick must be above 0 seconds, or None for no tick")
        if self.expected_duration not in ("oracle", "unknown"):
            raise ValueError("expected_duration must be 'oracle' or 'unknown'")


@dataclass(frozen=True)
class ReplayResult:
    """Everything a report needs from one replay of one scenario."""

    scenario: str
    workload: str
    cluster: str
    capacity_milli: int
    gpu_count: int
    tenants: tuple[str, ...]
    jobs: tuple[JobOutcome, ...]
    series: TimeSeries
    integrals: Integrals
    cycles: int
    events: int
    transitions: int
