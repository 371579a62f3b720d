"""The names a submit checks, cached: tenants, pools, and priority classes with their values.

Every submit needs to know that its tenant and pool exist and what its priority class is
worth. Those tables are small and change rarely, so :class:`Catalog` keeps all three in memory
and answers from there while its copy is younger than ``ttl_s`` seconds (monotonic time).

- A name the copy does not know is never refused from the copy: the copy is reloaded (in the
  caller's transaction) first, so a tenant created a moment ago by another server is found.
- A change made through this process's services calls :meth:`invalidate` after its commit,
  so this process sees it at once; another process sees it within ``ttl_s``
  (``ServerSettings.catalog_cache_s``). In that window a submit may still be accepted into a
  pool or tenant another process just deleted, or get a priority class's old value.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.store.models import PoolModel, PriorityClassModel, TenantModel


@dataclass(frozen=True)
class CatalogCopy:
    tenants: frozenset[str]
    pools: frozenset[str]
    priorities: dict[str, int]  # priority class name -> value
    deadline: float  # monotonic time after which the copy is reloaded before use


class Catalog:
    """See the module docstring."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._copy: CatalogCopy | None = None
        self._lock = threading.Lock()
        self._generation = 0

    def get(
        self, session: Session, tenant: str, pool: str, priority_class: str
    ) -> tuple[CatalogCopy, bool, bool, int | None]:
        """``(copy, tenant exists, pool exists, priority value or None)``; reloads the copy
        from ``session`` when it is stale or does not know one of the names."""
        copy = self._copy
        if copy is not None and time.monotonic() < copy.deadline:
            value = copy.priorities.get(priority_class)
            if tenant in copy.tenants and pool in copy.pools and value is not None:
                return copy, True, True, value
        copy = self.load(session)
        return (
            copy,
            tenant in copy.tenants,
            pool in copy.pools,
            copy.priorities.get(priority_class),
        )

    def load(self, session: Session) -> CatalogCopy:
        """Read the three tables (three small queries) and keep them as the copy."""
        generation = self._generation
        copy = CatalogCopy(
            tenants=frozenset(session.scalars(select(TenantModel.name))),
            pools=frozenset(session.scalars(select(PoolModel.name))),
            priorities={
                name: int(value)
                for name, value in session.execute(
                    select(PriorityClassModel.name, PriorityClassModel.value)
                )
            },
            deadline=time.monotonic() + self.ttl_s,
        )
        with self._lock:
            if generation == self._generation:  # else invalidated meanwhile: use, don't keep
                self._copy = copy
        return copy

    def invalidate(self) -> None:
        """Forget the copy (call after committing a change to tenants, pools or classes)."""
        with self._lock:
            self._generation += 1
            self._copy = None
