"""``/v1/pools``, ``/v1/tenants`` (with quotas) and ``/v1/priority-classes``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gpupool.api.deps import Act, Svc, Who
from gpupool.api.views import pool_view, priority_class_view, quota_view, tenant_view
from gpupool.control.errors import Invalid
from gpupool.domain.errors import InvalidValue
from gpupool.domain.pools import Pool
from gpupool.domain.tenants import PriorityClass, Quota, Tenant
from gpupool.schemas.admin import (
    PoolView,
    PriorityClassView,
    PutPoolRequest,
    PutPriorityClassRequest,
    PutQuotaRequest,
    PutTenantRequest,
    QuotaView,
    TenantView,
)

router = APIRouter(tags=["admin"])


def _domain(build: type, **kw: object) -> object:
    try:
        return build(**kw)
    except InvalidValue as exc:
        raise Invalid(exc.message) from None


@router.get("/v1/pools", response_model=list[PoolView])
def list_pools(svc: Svc, who: Who) -> list[PoolView]:
    return [pool_view(p) for p in svc.pools.list_pools(who)]


@router.get("/v1/pools/{name}", response_model=PoolView)
def get_pool(name: str, svc: Svc, who: Who) -> PoolView:
    return pool_view(svc.pools.get(who, name))


@router.put("/v1/pools/{name}", response_model=PoolView)
def put_pool(name: str, body: PutPoolRequest, svc: Svc, act: Act, response: Response) -> PoolView:
    pool = _domain(
        Pool,
        name=name,
        placement=body.placement,
        memory_overcommit=body.memory_overcommit,
        price_per_gpu_hour=tuple(sorted(body.price_per_gpu_hour.items())),
        default_price_per_gpu_hour=body.default_price_per_gpu_hour,
        memory_oversubscription=body.memory_oversubscription,
        container_engine=body.container_engine,
        image_registries=tuple(body.image_registries),
    )
    assert isinstance(pool, Pool)
    saved, created = svc.pools.put(act, pool)
    response.status_code = 201 if created else 200
    return pool_view(saved)


@router.delete("/v1/pools/{name}", status_code=204)
def delete_pool(name: str, svc: Svc, act: Act) -> None:
    svc.pools.delete(act, name)


@router.get("/v1/tenants", response_model=list[TenantView])
def list_tenants(svc: Svc, who: Who) -> list[TenantView]:
    standing = svc.tenants.standings(who)
    return [tenant_view(t, None, standing.get(t.name)) for t in svc.tenants.list_tenants(who)]


@router.get("/v1/tenants/{name}", response_model=TenantView)
def get_tenant(name: str, svc: Svc, who: Who) -> TenantView:
    tenant, quotas = svc.tenants.get(who, name)
    return tenant_view(tenant, quotas, svc.tenants.standings(who).get(name))


@router.put("/v1/tenants/{name}", response_model=TenantView)
def put_tenant(
    name: str, body: PutTenantRequest, svc: Svc, act: Act, response: Response
) -> TenantView:
    tenant = _domain(Tenant, name=name, fair_share=body.fair_share, display_name=body.display_name)
    assert isinstance(tenant, Tenant)
    saved, created = svc.tenants.put(act, tenant)
    response.status_code = 201 if created else 200
    return tenant_view(saved)


@router.delete("/v1/tenants/{name}", status_code=204)
def delete_tenant(name: str, svc: Svc, act: Act) -> None:
    svc.tenants.delete(act, name)


@router.put("/v1/tenants/{name}/quotas/{pool}", response_model=QuotaView)
def put_quota(name: str, pool: str, body: PutQuotaRequest, svc: Svc, act: Act) -> QuotaView:
    quota = _domain(Quota, tenant=name, pool=pool, **body.model_dump())
    assert isinstance(quota, Quota)
    return quota_view(svc.tenants.set_quota(act, quota))


@router.delete("/v1/tenants/{name}/quotas/{pool}", status_code=204)
def delete_quota(name: str, pool: str, svc: Svc, act: Act) -> None:
    svc.tenants.delete_quota(act, name, pool)


@router.get("/v1/priority-classes", response_model=list[PriorityClassView])
def list_priority_classes(svc: Svc, who: Who) -> list[PriorityClassView]:
    return [priority_class_view(p) for p in svc.tenants.list_priority_classes(who)]


@router.put("/v1/priority-classes/{name}", response_model=PriorityClassView)
def put_priority_class(
    name: str, body: PutPriorityClassRequest, svc: Svc, act: Act
) -> PriorityClassView:
    pc = _domain(PriorityClass, name=name, value=body.value)
    assert isinstance(pc, PriorityClass)
    return priority_class_view(svc.tenants.put_priority_class(act, pc))
