"""The audit log: one row per mutating API call (who, what, when, from where, how it ended).

Successful calls write their row in the same transaction as the change, so a change is never
without its record; refused and failed calls are written by the API in their own transaction,
through :class:`RefusedCalls`.

**Refused calls** are kept, but not one row each without end (1,000 unauthenticated POSTs
wrote 1,000 rows): per caller (user, or ``anonymous``), address and status, the first
``keep`` refusals of each ``window_s`` get their own row (``refused``); the rest are counted
in one row (action ``refused.more``, target ``N more refused calls like this``) that is
updated as they come, so the count is exact whenever it is read. A new window starts again
with rows of its own. The counts live in the memory of one server process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.services.auth import Actor
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


#: Refused calls per caller, address and status written one row each, per window.
REFUSED_KEEP = 10
#: The window of :class:`RefusedCalls`, in seconds.
REFUSED_WINDOW_S = 60.0
MORE_ACTION = "refused.more"


@dataclass
class _Window:
    start: float
    written: int = 0
    more: int = 0
    more_row: int | None = None  # id of the ``refused.more`` row, once there is one


class RefusedCalls:
    """Rate-limits and aggregates the audit rows of refused calls (see the module docstring).

    Thread-safe; :meth:`plan` decides under a lock, the caller writes in its transaction."""

    def __init__(self, keep: int = REFUSED_KEEP, window_s: float = REFUSED_WINDOW_S) -> None:
        self.keep = keep
        self.window_s = window_s
        self._windows: dict[tuple[str, str | None, int], _Window] = {}
        self._lock = threading.Lock()

    def record(
        self,
        session: Session,
        actor: Actor | None,
        now: float,
        *,
        status: int,
        method: str,
        path: str,
        remote: str | None,
    ) -> None:
        """Write the refused call's row, or count it in its window's ``refused.more`` row."""
        who = actor.principal.user if actor is not None else "anonymous"
        key = (who, remote, status)
        with self._lock:
            if len(self._windows) > 10_000:  # many callers: forget the finished windows
                self._windows = {
                    k: w for k, w in self._windows.items() if now - w.start < self.window_s
                }
            window = self._windows.get(key)
            if window is None or now - window.start >= self.window_s:
                window = self._windows[key] = _Window(start=now)
            if window.written < self.keep:
                window.written += 1
                more = 0
            else:
                window.more += 1
                more = window.more
            row_id = window.more_row
        kw: dict[str, Any] = {"status": status, "method": method, "path": path, "remote": remote}
        if more == 0:
            record(session, actor, "refused", now, **kw)
            return
        target = f"{more} more refused calls like this since {window.start:.0f}"
        existing = session.get(AuditModel, row_id) if row_id is not None else None
        if existing is not None:
            existing.target = target
            existing.time = now
            existing.path = path[:500]
            return
        row = AuditModel(**values(actor, MORE_ACTION, now, target=target, **kw))
        session.add(row)
        session.flush()
        with self._lock:
            window.more_row = row.id
