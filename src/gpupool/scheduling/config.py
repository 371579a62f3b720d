"""How the scheduler behaves: ordering weights, stage choices, preemption and backfill rules.

One frozen :class:`SchedulerConfig` goes into every :func:`~gpupool.scheduling.scheduler.schedule`
call. Stage names (``ordering``, ``admission``, ``preemption``, ``backfill``) select an
implementation from that stage's registry; an unknown name fails with the list of known ones.

Anti-loop settings (see :mod:`gpupool.scheduling.preemption`):

- ``preempt_exempt_s``: a running job is not preempted in its first ``preempt_exempt_s`` seconds.
  A job that was preempted and restarted is therefore not preempted again straight away.
- a victim's preemptor must outrank it strictly (or reclaim capacity the victim borrowed), so
  two jobs can never preempt each other in turn.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from gpupool.domain.errors import InvalidValue


class SizeDirection(enum.Enum):
    """Which jobs the size factor favours."""

    SMALL_FIRST = "small-first"
    LARGE_FIRST = "large-first"


@dataclass(frozen=True)
class OrderingWeights:
    """Weights of the multi-factor priority; each factor is in [0, 1]. They need not sum to 1."""

    priority: float = 0.30
    size: float = 0.25
    age: float = 0.20
    fairshare: float = 0.15
    efficiency: float = 0.10

    def __post_init__(self) -> None:
        for name in ("priority", "size", "age", "fairshare", "efficiency"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidValue(
                    f"ordering weight {name}={value} is not valid: use a number >= 0",
                    field=f"weights.{name}",
                )
        if self.total == 0:
            raise InvalidValue(
                "every ordering weight is 0: give at least one factor a weight above 0",
                field="weights",
            )

    @property
    def total(self) -> float:
        return self.priority + self.size + self.age + self.fairshare + self.efficiency


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of one scheduler.

    - ``weights``, ``size_direction``, ``max_age_s``: the multi-factor ordering (age saturates at
      ``max_age_s`` seconds of waiting).
    - ``ordering``, ``admission``, ``preemption``, ``backfill``: registry names of the stages.
      ``backfill`` is ``easy`` (reserve the first blocked job, backfill what does not delay it),
      ``strict`` (nothing starts behind a blocked job of the same pool) or ``greedy`` (start
      whatever fits, no reservation).
    - ``preemption_enabled``: switch preemption off without changing the stage.
    - ``default_placement``: the policy for pools whose ``placement`` is ``"default"``
      (``"default"`` here means the placement registry's default).
    - ``preempt_exempt_s``: see the module docstring; ``max_victims_per_job`` bounds one
      preemption; ``max_preemptors_per_cycle`` bounds how many blocked jobs try preempting.
    - ``max_jobs_per_cycle``: consider at most this many pending jobs (``None`` = all); the rest
      wait with ``CycleLimit``.
    - ``seed`` feeds any placement policy that uses randomness.
    """

    weights: OrderingWeights = field(default_factory=OrderingWeights)
    size_direction: SizeDirection = SizeDirection.SMALL_FIRST
    max_age_s: float = 7 * 86400.0
    ordering: str = "multifactor"
    admission: str = "quota"
    preemption: str = "cheapest"
    preemption_enabled: bool = True
    backfill: str = "easy"
    default_placement: str = "default"
    preempt_exempt_s: float = 300.0
    max_victims_per_job: int = 16
    max_preemptors_per_cycle: int = 32
    max_jobs_per_cycle: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.max_age_s) or self.max_age_s <= 0:
            raise InvalidValue(
                f"max_age_s={self.max_age_s} is not valid: use a positive number of seconds "
                "(e.g. 604800 for a week)",
                field="max_age_s",
            )
        if not math.isfinite(self.preempt_exempt_s) or self.preempt_exempt_s < 0:
            raise InvalidValue(
                f"preempt_exempt_s={self.preempt_exempt_s} is not valid: use 0 or more seconds",
                field="preempt_exempt_s",
            )
        if self.max_victims_per_job < 1:
            raise InvalidValue(
                "max_victims_per_job must be at least 1: set preemption_enabled=False to "
                "switch preemption off",
                field="max_victims_per_job",
            )
        if self.max_preemptors_per_cycle < 0:
            raise InvalidValue(
                "max_preemptors_per_cycle must be 0 or more", field="max_preemptors_per_cycle"
            )
        if self.max_jobs_per_cycle is not None and self.max_jobs_per_cycle < 1:
            raise InvalidValue(
                "max_jobs_per_cycle must be at least 1, or None to consider every pending job",
                field="max_jobs_per_cycle",
            )
        for name in ("ordering", "admission", "preemption", "backfill", "default_placement"):
            if not getattr(self, name):
                raise InvalidValue(f"{name} is empty: name a registered stage", field=name)
