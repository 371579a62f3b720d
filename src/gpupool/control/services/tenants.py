"""Tenants, their quotas per pool, and priority classes.

Managing tenants, quotas and priority classes needs ``tenant:manage`` (admin). Reading them
needs ``tenant:read``; a tenant-scoped role sees only its own tenant and its quotas.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.machinery.snapshot import decayed_usage
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, require, tenant_visible
from gpupool.domain.errors import InvalidValue
from gpupool.domain.tenants import PriorityClass, Quota, Tenant, stored_fair_share
from gpupool.domain.users import Permission
from gpupool.store.mapping import priority_class_from_row, quota_from_row, tenant_from_row
from gpupool.store.models import (
    JobModel,
    PoolModel,
    PriorityClassModel,
    QuotaModel,
    TenantModel,
    UserModel,
)


def _not_found(name: str) -> NotFound:
    return NotFound(f"tenant {name!r} not found: list tenants with `gpupool tenants`")


@dataclass(frozen=True)
class Standing:
    """A tenant's fair-share standing as the scheduler computes it: ``usage_milli_s`` its
    decayed usage (milli-GPU·seconds, one-week half-life) and ``factor`` in [0, 1], the
    ``fairshare`` ordering factor ``2 ** (-U / S)`` (``U`` its share of all decayed usage, ``S``
    its share of all fair shares; 1 when nobody used anything)."""

    usage_milli_s: float
    factor: float


def standings(shares: dict[str, float], usage: dict[str, float]) -> dict[str, Standing]:
    """Standing of every tenant in ``shares`` (see :class:`Standing`)."""
    tenants = set(shares) | set(usage)
    total_usage = sum(max(0.0, usage.get(t, 0.0)) for t in tenants)
    total_share = sum(shares.get(t, 1.0) for t in tenants)
    out = {}
    for t, share in shares.items():
        used = max(0.0, usage.get(t, 0.0))
        if total_usage <= 0 or total_share <= 0 or share <= 0:
            factor = 1.0
        else:
            factor = float(2.0 ** (-(used / total_usage) / (share / total_share)))
        out[t] = Standing(used, factor)
    return out


class TenantService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    # -- tenants
    def list_tenants(self, principal: Principal) -> list[Tenant]:
        require(principal, Permission.TENANT_READ)
        with self.cp.read() as s:
            query = select(TenantModel).order_by(TenantModel.name)
            if not principal.cluster_wide:
                query = query.where(TenantModel.name == principal.tenant)
            return [tenant_from_row(r) for r in s.scalars(query)]

    def standings(self, principal: Principal) -> dict[str, Standing]:
        """Fair-share standing of the tenants the principal may see."""
        require(principal, Permission.TENANT_READ)
        with self.cp.read() as s:
            rows = s.execute(select(TenantModel.name, TenantModel.fair_share))
            shares = {str(name): stored_fair_share(share) for name, share in rows}
            usage = decayed_usage(s, self.cp.now())
        return {t: v for t, v in standings(shares, usage).items() if tenant_visible(principal, t)}

    def get(self, principal: Principal, name: str) -> tuple[Tenant, list[Quota]]:
        require(principal, Permission.TENANT_READ)
        with self.cp.read() as s:
            row = s.get(TenantModel, name)
            if row is None or not tenant_visible(principal, name):
                raise _not_found(name)
            quotas = s.scalars(select(QuotaModel).where(QuotaModel.tenant == name))
            return tenant_from_row(row), [quota_from_row(q) for q in quotas]

    def put(self, actor: Actor, tenant: Tenant) -> tuple[Tenant, bool]:
        require(actor.principal, Permission.TENANT_MANAGE)
        try:
            tenant = Tenant(tenant.name, tenant.fair_share, tenant.display_name)
        except InvalidValue as exc:
            raise Invalid(exc.message) from None
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(TenantModel, tenant.name)
            created = row is None
            if row is None:
                row = TenantModel(name=tenant.name, created_at=now)
                s.add(row)
            row.fair_share = tenant.fair_share
            row.display_name = tenant.display_name
            action = "tenant.create" if created else "tenant.update"
            audit.record(s, actor, action, now, target=tenant.name)
        self.cp.catalog.invalidate()
        return tenant, created

    def delete(self, actor: Actor, name: str) -> None:
        require(actor.principal, Permission.TENANT_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(TenantModel, name)
            if row is None:
                raise _not_found(name)
            users = s.scalar(select(func.count()).where(UserModel.tenant == name)) or 0
            jobs = s.scalar(select(func.count()).where(JobModel.tenant == name)) or 0
            if users or jobs:
                raise Conflict(
                    f"tenant {name} still has {users} users and {jobs} jobs: remove its users "
                    "first; tenants with job history are kept for accounting"
                )
            s.delete(row)
            audit.record(s, actor, "tenant.delete", now, target=name)
        self.cp.catalog.invalidate()

    # -- quotas
    def set_quota(self, actor: Actor, quota: Quota) -> Quota:
        require(actor.principal, Permission.TENANT_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            if s.get(TenantModel, quota.tenant) is None:
                raise _not_found(quota.tenant)
            if s.get(PoolModel, quota.pool) is None:
                raise Invalid(f"pool {quota.pool!r} does not exist: create it first")
            row = s.get(QuotaModel, (quota.tenant, quota.pool))
            if row is None:
                row = QuotaModel(tenant=quota.tenant, pool=quota.pool)
                s.add(row)
            row.guaranteed_milli = quota.guaranteed_milli
            row.limit_milli = quota.limit_milli
            row.guaranteed_memory_mib = quota.guaranteed_memory_mib
            row.limit_memory_mib = quota.limit_memory_mib
            row.gpu_hour_budget = quota.gpu_hour_budget
            row.budget_window_s = quota.budget_window_s
            audit.record(s, actor, "quota.set", now, target=f"{quota.tenant}/{quota.pool}")
        self.cp.poke()
        return quota

    def delete_quota(self, actor: Actor, tenant: str, pool: str) -> None:
        require(actor.principal, Permission.TENANT_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(QuotaModel, (tenant, pool))
            if row is None:
                raise NotFound(f"tenant {tenant} has no quota in pool {pool}")
            s.delete(row)
            audit.record(s, actor, "quota.delete", now, target=f"{tenant}/{pool}")
        self.cp.poke()

    # -- priority classes
    def list_priority_classes(self, principal: Principal) -> list[PriorityClass]:
        require(principal, Permission.POOL_READ)
        with self.cp.read() as s:
            rows = s.scalars(select(PriorityClassModel).order_by(PriorityClassModel.value))
            return [priority_class_from_row(r) for r in rows]

    def put_priority_class(self, actor: Actor, pc: PriorityClass) -> PriorityClass:
        require(actor.principal, Permission.TENANT_MANAGE)
        try:
            pc = PriorityClass(pc.name, pc.value)
        except InvalidValue as exc:
            raise Invalid(exc.message) from None
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(PriorityClassModel, pc.name)
            if row is None:
                s.add(PriorityClassModel(name=pc.name, value=pc.value))
            else:
                row.value = pc.value
            audit.record(s, actor, "priority-class.put", now, target=pc.name)
        self.cp.catalog.invalidate()
        return pc
