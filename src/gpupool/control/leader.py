"""Leadership: only one server schedules, and a deposed one cannot write.

Words:

- **lease**: held while this server keeps a PostgreSQL session-level advisory lock open on a
  dedicated connection (SQLite: an exclusive ``flock`` on ``$GPUPOOL_HOME/leader.lock``, since
  SQLite stores are served by one host). The lease is lost when that connection (or process)
  dies, and the next server takes it.
- **epoch**: on taking the lease a server increments ``leader.epoch`` and remembers the value.
  Every scheduling commit re-reads the row (``SELECT ... FOR UPDATE``) and aborts when the
  epoch is not its own, so a server that lost its lease without noticing (a long GC pause, a
  partition) cannot commit a stale decision.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from typing import IO

from sqlalchemy import Connection, select, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader, Unavailable
from gpupool.store.models import LeaderModel

log = logging.getLogger("gpupool.control.leader")

#: Advisory lock key: "gpupool" in ASCII, as a 64-bit integer.
LOCK_KEY = 0x677075706F6F6C


class Leadership:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self._conn: Connection | None = None
        self._file: IO[str] | None = None

    @property
    def is_leader(self) -> bool:
        return self.cp.epoch > 0

    def _take_lock(self) -> bool:
        if self.cp.sqlite:
            path = self.cp.settings.home / "leader.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held while leading
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                return False
            handle.seek(0)
            handle.truncate()
            handle.write(f"{self.cp.settings.server_id} pid {os.getpid()}\n")
            handle.flush()
            self._file = handle
            return True
        conn = self.cp.engine.connect()
        try:
            got = bool(
                conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
            )
            conn.commit()
        except (OperationalError, DBAPIError):
            conn.close()
            raise
        if not got:
            conn.close()  # no lock taken: the connection may go back to the pool
            return False
        self._conn = conn
        return True

    def try_acquire(self) -> bool:
        """Take the lease if free; on success bump the epoch. Returns whether we lead."""
        if self.is_leader:
            return self.check()
        try:
            if not self._take_lock():
                return False
            with self.cp.tx() as s:
                row = s.get(LeaderModel, 1, with_for_update=True)
                if row is None:
                    row = LeaderModel(id=1, epoch=0, holder="", since=0.0)
                    s.add(row)
                row.epoch += 1
                row.holder = self.cp.settings.server_id
                row.since = self.cp.now()
                epoch = row.epoch
        except (Unavailable, OperationalError, DBAPIError) as exc:
            log.warning("could not take the scheduling lease: %s", exc)
            self.release()
            return False
        self.cp.epoch = epoch
        log.info("this server leads scheduling, epoch %d", epoch)
        return True

    def check(self) -> bool:
        """Still leading? (PostgreSQL: the lock connection is alive.)"""
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                self._conn.commit()
            except (OperationalError, DBAPIError):
                log.warning("lost the scheduling lease (database connection gone)")
                self.release()
                return False
        return self.is_leader

    def release(self) -> None:
        self.cp.epoch = 0
        if self._conn is not None:
            # Session-level advisory locks live as long as the database session: a pooled
            # connection would keep the lock, so unlock and throw the connection away.
            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            with contextlib.suppress(Exception):
                self._conn.invalidate()
                self._conn.close()
            self._conn = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
                self._file.close()
            self._file = None


def check_epoch(session: Session, epoch: int) -> None:
    """Raise :class:`NotLeader` unless ``epoch`` is still the one in force (locks the row)."""
    current = session.scalar(select(LeaderModel.epoch).where(LeaderModel.id == 1).with_for_update())
    if epoch <= 0 or current != epoch:
        raise NotLeader(
            f"this server's scheduling epoch {epoch} is not current ({current}): "
            "another server took over scheduling"
        )
