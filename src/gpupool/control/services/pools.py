"""Pools: create, update, list, delete; and moving devices between pools.

Changing a pool needs ``pool:manage`` (admin, operator). Everyone with ``pool:read`` sees pools.
"""

from __future__ import annotations

from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.services import audit
from gpupool.control.services.auth import Actor, Principal, require
from gpupool.control.services.envelope import envelopes
from gpupool.domain.errors import InvalidValue
from gpupool.domain.pools import Pool
from gpupool.domain.users import Permission
from gpupool.store.mapping import pool_from_row
from gpupool.store.models import DeviceModel, JobModel, PoolModel


def _validate(pool: Pool) -> Pool:
    try:
        return Pool(
            name=pool.name,
            placement=pool.placement,
            memory_overcommit=pool.memory_overcommit,
            price_per_gpu_hour=pool.price_per_gpu_hour,
            default_price_per_gpu_hour=pool.default_price_per_gpu_hour,
            memory_oversubscription=pool.memory_oversubscription,
            container_engine=pool.container_engine,
            image_registries=pool.image_registries,
        )
    except InvalidValue as exc:
        raise Invalid(exc.message) from None


class PoolService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def list_pools(self, principal: Principal) -> list[Pool]:
        require(principal, Permission.POOL_READ)
        with self.cp.read() as s:
            return [pool_from_row(r) for r in s.scalars(select(PoolModel).order_by(PoolModel.name))]

    def get(self, principal: Principal, name: str) -> Pool:
        require(principal, Permission.POOL_READ)
        with self.cp.read() as s:
            row = s.get(PoolModel, name)
            if row is None:
                raise NotFound(f"pool {name!r} not found: list pools with `gpupool pools`")
            return pool_from_row(row)

    def put(self, actor: Actor, pool: Pool) -> tuple[Pool, bool]:
        """Create or replace a pool; returns it and whether it was created."""
        require(actor.principal, Permission.POOL_MANAGE)
        pool = _validate(pool)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(PoolModel, pool.name)
            created = row is None
            if row is None:
                row = PoolModel(name=pool.name, created_at=now)
                s.add(row)
            row.placement = pool.placement
            row.memory_overcommit = pool.memory_overcommit
            row.prices = dict(pool.price_per_gpu_hour)
            row.default_price = pool.default_price_per_gpu_hour
            row.memory_oversubscription = pool.memory_oversubscription
            row.container_engine = pool.container_engine
            row.image_registries = list(pool.image_registries)
            audit.record(
                s, actor, "pool.create" if created else "pool.update", now, target=pool.name
            )
        self.cp.catalog.invalidate()
        envelopes(self.cp).invalidate()  # overcommit and pools change what a node holds
        self.cp.poke()
        return pool, created

    def delete(self, actor: Actor, name: str) -> None:
        require(actor.principal, Permission.POOL_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(PoolModel, name)
            if row is None:
                raise NotFound(f"pool {name!r} not found")
            devices = s.scalar(select(func.count()).where(DeviceModel.pool == name)) or 0
            jobs = s.scalar(select(func.count()).where(JobModel.pool == name)) or 0
            if devices or jobs:
                raise Conflict(
                    f"pool {name} still has {devices} devices and {jobs} jobs: move the devices "
                    "to another pool (POST /v1/devices/{uuid}/pool, Client.move_device) and let "
                    "its jobs finish first"
                )
            s.delete(row)
            audit.record(s, actor, "pool.delete", now, target=name)
        self.cp.catalog.invalidate()
        envelopes(self.cp).invalidate()  # overcommit and pools change what a node holds

    def move_device(self, actor: Actor, uuid: str, pool: str) -> None:
        require(actor.principal, Permission.NODE_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            device = s.get(DeviceModel, uuid)
            if device is None:
                raise NotFound(f"device {uuid!r} not found: list devices with `gpupool gpus`")
            if s.get(PoolModel, pool) is None:
                raise Invalid(f"pool {pool!r} does not exist: create it first")
            device.pool = pool
            audit.record(s, actor, "device.move", now, target=f"{uuid}->{pool}")
        envelopes(self.cp).invalidate()
        self.cp.poke()
