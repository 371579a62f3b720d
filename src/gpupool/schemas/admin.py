"""Wire models for pools, tenants, quotas, priority classes, users and tokens.

Compute amounts are milli-GPU integers (``guaranteed_milli: 2000`` is two GPUs), memory in MiB;
prices are per whole GPU per hour in the pool's currency.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from gpupool.domain.errors import InvalidValue
from gpupool.domain.tenants import (
    FAIR_SHARE_MAX,
    FAIR_SHARE_MIN,
    FAIR_SHARE_RANGE,
    check_fair_share,
)
from gpupool.schemas.base import WireModel
from gpupool.schemas.common import GpuHours, Price, QuotaMiB, QuotaMilli, WindowSeconds

#: The pool settings a view shows and a PUT takes, each declared once.
Oversubscription = Annotated[
    str,
    Field(
        pattern="^(fail|spill)$",
        description="isolation shim: an allocation that fits the slice but not the GPU fails "
        "(fail) or is served from host memory (spill)",
    ),
]
EngineName = Annotated[
    str | None,
    Field(
        max_length=16,
        description="engine of container jobs that name none (podman, docker); null: each "
        "node's first available",
    ),
]
Registries = Annotated[
    list[str],
    Field(
        max_length=100,
        description="registries images may come from (nvcr.io, *.example.com, localhost); "
        "empty: any",
    ),
]


class PoolView(WireModel):
    name: str
    placement: str = "default"
    memory_overcommit: float = Field(default=1.0, ge=1.0, le=4.0)
    price_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    default_price_per_gpu_hour: float = Field(default=0.0, ge=0.0)
    memory_oversubscription: Oversubscription = "fail"
    container_engine: EngineName = None
    image_registries: Registries = Field(default_factory=list)


class PutPoolRequest(WireModel):
    placement: str = "default"
    memory_overcommit: float = Field(default=1.0, ge=1.0, le=4.0)
    price_per_gpu_hour: dict[str, Price] = Field(default_factory=dict)
    default_price_per_gpu_hour: Price = 0.0
    memory_oversubscription: Oversubscription = "fail"
    container_engine: EngineName = None
    image_registries: Registries = Field(default_factory=list)


class QuotaView(WireModel):
    tenant: str
    pool: str
    guaranteed_milli: int = Field(default=0, ge=0)
    limit_milli: int | None = Field(default=None, ge=0)
    guaranteed_memory_mib: int = Field(default=0, ge=0)
    limit_memory_mib: int | None = Field(default=None, ge=0)
    gpu_hour_budget: float | None = Field(default=None, ge=0)
    budget_window_s: float = Field(default=30 * 86400.0, gt=0)


class PutQuotaRequest(WireModel):
    guaranteed_milli: QuotaMilli = 0
    limit_milli: QuotaMilli | None = None
    guaranteed_memory_mib: QuotaMiB = 0
    limit_memory_mib: QuotaMiB | None = None
    gpu_hour_budget: GpuHours | None = None
    budget_window_s: WindowSeconds = 30 * 86400.0


class TenantView(WireModel):
    name: str
    fair_share: float
    display_name: str
    quotas: list[QuotaView] = Field(default_factory=list)
    decayed_usage_milli_s: float | None = Field(
        default=None, description="decayed usage, milli-GPU seconds (one-week half-life)"
    )
    fair_share_factor: float | None = Field(
        default=None, ge=0.0, le=1.0, description="the scheduler's fairshare factor, 1 = best"
    )


class PutTenantRequest(WireModel):
    fair_share: float = Field(
        default=1.0,
        ge=FAIR_SHARE_MIN,
        le=FAIR_SHARE_MAX,
        description=f"relative share for fair-share ordering, {FAIR_SHARE_RANGE} (1 = equal)",
    )
    display_name: str = Field(default="", max_length=200)

    @field_validator("fair_share", mode="before")
    @classmethod
    def _in_range(cls, value: object) -> object:
        # Before pydantic's own checks, so every refusal (NaN, Infinity, 1e308, -1) states the
        # accepted range in the same words as the domain does.
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                check_fair_share(value)
            except InvalidValue as exc:
                raise ValueError(exc.message) from None
        return value


class PriorityClassView(WireModel):
    name: str
    value: int = Field(ge=0, le=1_000_000)


class PutPriorityClassRequest(WireModel):
    value: int = Field(ge=0, le=1_000_000)


class UserView(WireModel):
    name: str
    role: str
    tenant: str | None


class CreateUserRequest(WireModel):
    name: str
    role: str = Field(description="admin, operator, tenant-admin, member, viewer or agent")
    tenant: str | None = None


class CreateTokenRequest(WireModel):
    user: str | None = Field(default=None, description="default: yourself")
    name: str = Field(default="", max_length=200)
    ttl_s: float | None = Field(default=None, gt=0, description="lifetime; None = no expiry")


class TokenView(WireModel):
    id: str
    user: str
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None


class IssuedTokenView(WireModel):
    """A new token. ``secret`` is shown this once: store it now."""

    id: str
    user: str
    name: str
    secret: str
    expires_at: float | None


class WhoAmI(WireModel):
    user: str
    role: str
    tenant: str | None
    permissions: list[str]


class AuditView(WireModel):
    time: float
    actor: str
    role: str
    action: str
    method: str
    path: str
    status: int
    remote: str | None
    target: str | None
