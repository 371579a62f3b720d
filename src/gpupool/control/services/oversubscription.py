"""Memory oversubscription under the CUDA shim: the pool's choice, and what spilled.

A pool's ``memory_oversubscription`` (``fail`` or ``spill``, see :mod:`gpupool.domain.pools`)
travels to the agent in each assignment; the agent reports, per device, the bytes its shim
replica holds in host memory, kept on the replica's slices (``SliceModel.spilled_bytes``) for
the job's view and the ``gpupool_slice_spilled_bytes`` metric. Start orders read the pool's
default container engine here too (:func:`container_engine_of`), as they read its choice.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.store.models import PoolModel, SliceModel


def oversubscription_of(s: Session, pool: str) -> str:
    """The pool's ``memory_oversubscription`` (``fail`` for a pool without a row)."""
    row = s.get(PoolModel, pool)
    return row.memory_oversubscription if row is not None else "fail"


def record_spilled(s: Session, assignment_id: str, spilled: dict[str, int]) -> None:
    """Keep each active slice's spilled bytes as the agent read them from the shim's region."""
    for sl in s.scalars(
        select(SliceModel).where(
            SliceModel.assignment_id == assignment_id, SliceModel.active.is_(True)
        )
    ):
        value = spilled.get(sl.device_uuid)
        if value is not None and value >= 0 and sl.spilled_bytes != value:
            sl.spilled_bytes = value


def container_engine_of(s: Session, pool: str) -> str | None:
    """The pool's default container engine (``None``: each node's first available)."""
    row = s.get(PoolModel, pool)
    return row.container_engine if row is not None else None
