"""The notices outbox: ``--mail-type`` notices kept in the store (table ``notices``) from the
transaction that moved the job until they are sent (see :mod:`gpupool.control.notify` for the
whole journey; this module holds its statements).

Words:

- **stage**: write a transaction's notices as outbox rows, in that transaction (one INSERT),
  so that they exist if and only if the job's move committed.
- **claim**: take due rows for sending, one short transaction: ``claimed_by`` set to this
  process's owner name and ``claimed_until`` to now + :data:`LEASE_S`. The rows are chosen by
  a subquery ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two replicas claiming at once take
  different rows; SQLite has one writer at a time, which serialises the claims the same way.
  Nothing is sent inside a transaction.
- **owner**: ``host:pid:random`` of the claiming process. A claim ends when its row is deleted
  (sent, or failed :data:`ATTEMPTS` times) or put back with a later ``due`` (retry). A claim
  whose owner died stays until ``claimed_until``, except that a server starting on the same
  host frees at once the claims of owners whose process is gone (:func:`release_dead`), so a
  server killed mid-send and restarted sends its notices again within a second. (This rests on
  a host name naming one machine, or one PID namespace; an owner of this very process is dead
  only once its sender stopped, :func:`retire`.)
- **due**: wall-clock epoch seconds (shared by every process on the store; not the control
  plane's clock, which the simulator and tests may stop): when a row may be claimed next.

Delivery is at least once: a send that reached the receiver but whose owner died before the
row was deleted is sent again (the receiver sees the same ``job_id``, ``event`` and ``time``).
A send that takes longer than :data:`LEASE_S` may be claimed and sent by another process too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from gpupool.store.models import NoticeModel

#: Seconds a claim lasts: longer than any send (each network step times out after 10 s).
LEASE_S = 120.0
#: Rows one claim takes at most (sent one after another by one thread).
BATCH = 32


#: The owners of this process's live senders (a process may hold several control planes).
_LIVE: set[str] = set()


def owner_name() -> str:
    """A new name for one sender's claims, ``host:pid:random``, alive until :func:`retire`
    (see :func:`release_dead`)."""
    name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    _LIVE.add(name)
    return name


def retire(owner: str) -> None:
    """``owner``'s sender stopped: a later sender of this process may free its claims."""
    _LIVE.discard(owner)


@dataclass(frozen=True)
class Claimed:
    """One claimed row: its id, where it goes, the notice's fields, and sends tried before."""

    id: int
    recipient: str
    body: dict[str, Any]
    attempts: int


def stage(session: Session, rows: Sequence[dict[str, Any]], now: float) -> None:
    """Write ``rows`` (``job_id``, ``recipient``, ``body``) to the outbox in ``session``'s
    transaction: one INSERT, due at once."""
    values = [
        {**row, "attempts": 0, "due": 0.0, "claimed_until": 0.0, "created_at": now} for row in rows
    ]
    session.execute(insert(NoticeModel), values)


def claim(session: Session, owner: str, now: float, limit: int = BATCH) -> list[Claimed]:
    """Claim up to ``limit`` due rows nobody holds, oldest first (see the module docstring)."""
    free = (
        select(NoticeModel.id)
        .where(NoticeModel.due <= now, NoticeModel.claimed_until <= now)
        .order_by(NoticeModel.id)
        .limit(limit)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders none: one writer
    )
    claimed = session.execute(
        update(NoticeModel)
        .where(NoticeModel.id.in_(free.scalar_subquery()))
        .values(claimed_by=owner, claimed_until=now + LEASE_S)
        .returning(NoticeModel.id, NoticeModel.recipient, NoticeModel.body, NoticeModel.attempts)
        .execution_options(synchronize_session=False)
    ).all()
    return sorted((Claimed(*row) for row in claimed), key=lambda c: c.id)


def done(session: Session, owner: str, row_id: int) -> None:
    """The row was sent, or failed for the last time: delete it (if this owner still holds
    it)."""
    session.execute(
        delete(NoticeModel)
        .where(NoticeModel.id == row_id, NoticeModel.claimed_by == owner)
        .execution_options(synchronize_session=False)
    )


def retry(session: Session, owner: str, row_id: int, attempts: int, due: float) -> None:
    """Put the row back, free, for another send at ``due`` (``attempts`` tried so far)."""
    session.execute(
        update(NoticeModel)
        .where(NoticeModel.id == row_id, NoticeModel.claimed_by == owner)
        .values(attempts=attempts, due=due, claimed_by=None, claimed_until=0.0)
        .execution_options(synchronize_session=False)
    )


def next_due(session: Session) -> float | None:
    """When the earliest row may be claimed (epoch seconds), ``None`` for an empty outbox."""
    later = case(
        (NoticeModel.due > NoticeModel.claimed_until, NoticeModel.due),
        else_=NoticeModel.claimed_until,
    )
    when = session.scalar(select(func.min(later)))
    return None if when is None else float(when)


def release_dead(session: Session, now: float) -> int:
    """Free the live claims of owners on this host whose process is gone (a server killed
    mid-send); returns how many rows were freed. Owners elsewhere wait for their lease."""
    host = socket.gethostname()
    owners = session.scalars(
        select(NoticeModel.claimed_by)
        .where(NoticeModel.claimed_by.like(f"{host}:%"), NoticeModel.claimed_until > now)
        .distinct()
    ).all()
    # LIKE's _ and % may match other hosts' names: only this host's owners are judged here
    dead = [o for o in owners if o and o.startswith(f"{host}:") and not _alive(o, host)]
    if not dead:
        return 0
    freed = session.execute(
        update(NoticeModel)
        .where(or_(*(NoticeModel.claimed_by == o for o in dead)))
        .values(claimed_by=None, claimed_until=0.0)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(freed, "rowcount", 0) or 0)


def _alive(owner: str, host: str) -> bool:
    pid_text = owner[len(host) + 1 :].split(":", 1)[0]
    if not pid_text.isdigit():
        return True  # not one of ours: leave it to its lease
    pid = int(pid_text)
    if pid == os.getpid():  # another sender of this process, or an earlier process of this pid
        return owner in _LIVE
    with contextlib.suppress(PermissionError):  # PermissionError: it exists, someone else's
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True
