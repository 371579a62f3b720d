"""The audit log: one row per mutating API call (who, what, when, from where, how it ended).

Successful calls write their row in the same transaction as the change, so a change is never
without its record; refused and failed calls are written by the API in their own transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.auth import Actor
from gpupool.store.models import AuditModel


def values(
    actor: Actor | None,
    action: str,
    now: float,
    *,
    target: str | None = None,
    status: int = 200,
    user: str | None = None,
    role: str | None = None,
    method: str | None = None,
    path: str | None = None,
    remote: str | None = None,
) -> dict[str, Any]:
    """The columns of one audit row."""
    principal = actor.principal if actor is not None else None
    return {
        "time": now,
        "actor": user or (principal.user if principal else "anonymous"),
        "role": role or (principal.role.value if principal else ""),
        "action": action,
        "method": method or (actor.method if actor else ""),
        "path": (path or (actor.path if actor else ""))[:500],
        "status": status,
        "remote": remote or (actor.remote if actor else None),
        "target": target,
    }


def record(
    session: Session,
    actor: Actor | None,
    action: str,
    now: float,
    **kw: Any,
) -> None:
    """Add an audit row to ``session`` (committed with the caller's transaction).

    Keywords: ``target``, ``status``, ``user``, ``role``, ``method``, ``path``, ``remote``
    (see :func:`values`).
    """
    session.add(AuditModel(**values(actor, action, now, **kw)))


def recent(
    session: Session,
    limit: int = 100,
    since: float | None = None,
    *,
    until: float | None = None,
    actor: str | None = None,
    action: str | None = None,
    target: str | None = None,
) -> list[AuditModel]:
    """The newest ``limit`` rows, newest first, in ``[since, until)``; ``actor`` and ``target``
    match exactly, ``action`` as a prefix (``job`` finds ``job.submit`` and ``job.cancel``)."""
    query = select(AuditModel).order_by(AuditModel.id.desc()).limit(limit)
    if since is not None:
        query = query.where(AuditModel.time >= since)
    if until is not None:
        query = query.where(AuditModel.time < until)
    if actor is not None:
        query = query.where(AuditModel.actor == actor)
    if target is not None:
        query = query.where(AuditModel.target == target)
    if action is not None:
        query = query.where(AuditModel.action.startswith(action, autoescape=True))
    return list(session.scalars(query))
