"""Tenants (teams), their quotas per pool, and priority classes.

Quota words, as the scheduler's admission stage uses them:

- **guaranteed**: milli-GPU (and MiB of GPU memory) the tenant is always entitled to in a pool.
  A job that fits within it is *in-quota* and is never preempted to make room for another
  tenant's job.
- **limit**: the most the tenant may hold in the pool. Between guaranteed and limit a job
  *borrows* idle capacity: it may run, but is reclaimable when an owner needs its guarantee back.
  Above limit a job waits (``QuotaExceeded``).
- **gpu-hour budget**: optional; whole-GPU hours the tenant may use per ``budget_window_s``.
  ``None`` means no budget.

``None`` for a limit means unlimited; for memory it means "not limited by memory".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpupool.domain.errors import InvalidValue
from gpupool.domain.pools import validate_name

#: The accepted range of a tenant's ``fair_share`` (1.0 is an equal share). Bounded so that
#: every ratio the fair-share factor takes (share / sum of shares, usage / share) stays a
#: finite, non-zero float for any number of tenants.
FAIR_SHARE_MIN = 0.001
FAIR_SHARE_MAX = 1_000_000.0
FAIR_SHARE_RANGE = f"from {FAIR_SHARE_MIN:g} to {FAIR_SHARE_MAX:.0f}"


def check_fair_share(value: float, tenant: str | None = None) -> float:
    """``value`` when it is a finite fair share in range; otherwise :class:`InvalidValue`."""
    whose = f"tenant {tenant}: " if tenant else ""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidValue(
            f"{whose}fair_share must be a number {FAIR_SHARE_RANGE}", field="fair_share"
        )
    if not math.isfinite(value) or not FAIR_SHARE_MIN <= value <= FAIR_SHARE_MAX:
        raise InvalidValue(
            f"{whose}fair_share {value!r} is out of range: use a number {FAIR_SHARE_RANGE} "
            "(1.0 is an equal share, 2 twice that)",
            field="fair_share",
        )
    return float(value)


def stored_fair_share(value: float | None) -> float:
    """A fair share read from the store, made safe: rows written before the range was enforced
    may hold anything. Out-of-range numbers read as the nearest bound, NaN or nothing as 1.0
    (an equal share); setting the tenant again stores a valid value."""
    if value is None or math.isnan(value):
        return 1.0
    return min(max(float(value), FAIR_SHARE_MIN), FAIR_SHARE_MAX)


@dataclass(frozen=True)
class Tenant:
    """A team. ``fair_share`` is its relative share of the pool for fair-share ordering."""

    name: str
    fair_share: float = 1.0
    display_name: str = ""

    def __post_init__(self) -> None:
        validate_name("tenant", self.name)
        check_fair_share(self.fair_share, self.name)


@dataclass(frozen=True)
class Quota:
    """A tenant's quota in one pool. Compute in milli-GPU, memory in MiB."""

    tenant: str
    pool: str
    guaranteed_milli: int = 0
    limit_milli: int | None = None
    guaranteed_memory_mib: int = 0
    limit_memory_mib: int | None = None
    gpu_hour_budget: float | None = None
    budget_window_s: float = 30 * 86400.0

    def __post_init__(self) -> None:
        where = f"quota of {self.tenant} in {self.pool}"
        if self.guaranteed_milli < 0 or self.guaranteed_memory_mib < 0:
            raise InvalidValue(f"{where}: guaranteed amounts must be >= 0", field="guaranteed")
        if self.limit_milli is not None and self.limit_milli < self.guaranteed_milli:
            raise InvalidValue(
                f"{where}: limit ({self.limit_milli}m) is below guaranteed "
                f"({self.guaranteed_milli}m): raise the limit or lower the guarantee",
                field="limit",
            )
        if self.limit_memory_mib is not None and self.limit_memory_mib < self.guaranteed_memory_mib:
            raise InvalidValue(
                f"{where}: memory limit is below the guaranteed memory", field="limit_memory"
            )
        if self.gpu_hour_budget is not None and self.gpu_hour_budget < 0:
            raise InvalidValue(f"{where}: gpu_hour_budget must be >= 0", field="gpu_hour_budget")
        if self.budget_window_s <= 0:
            raise InvalidValue(f"{where}: budget window must be positive", field="budget_window")


@dataclass(frozen=True)
class PriorityClass:
    """A named priority level. Higher ``value`` is more important."""

    name: str
    value: int

    def __post_init__(self) -> None:
        validate_name("priority class", self.name)
        if not 0 <= self.value <= 1_000_000:
            raise InvalidValue(
                f"priority class {self.name}: value {self.value} is out of range: use 0..1000000",
                field="value",
            )


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("low", 100),
    PriorityClass("normal", 500),
    PriorityClass("high", 900),
)
DEFAULT_PRIORITY_CLASS = "normal"
