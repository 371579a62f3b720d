"""The control plane's shared parts: the store, the clock, the settings, the loop's wake-up,
and the hot path's caches (``principals``: see :mod:`gpupool.control.services.auth`; ``catalog``:
see :mod:`gpupool.control.services.catalog`).

:class:`ControlPlane` is built once per server process and handed to every service. ``tx()`` is
the one way services open a transaction; a database that is down surfaces as
:class:`~gpupool.control.errors.Unavailable` (HTTP 503) with a message that says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from gpupool.control.errors import Unavailable
from gpupool.control.machinery.admission import Admission
from gpupool.control.machinery.clock import Clock, SystemClock
from gpupool.control.machinery.orders import ORDER_NODES, OrderBoard, bump_versions
from gpupool.control.machinery.reportbook import ReportBook
from gpupool.control.machinery.settled import SettledNodes
from gpupool.control.notify import NOTICES_CHANNEL, Notifier, stage
from gpupool.control.services.auth import PrincipalCache
from gpupool.control.services.catalog import Catalog
from gpupool.control.settings import ServerSettings
from gpupool.store.db import READ_ONLY, is_sqlite, make_engine, session_factory
from gpupool.store.notify import ORDERS_CHANNEL, WAKE_CHANNEL, Listener, parse, publish, send
from gpupool.store.schema import ensure_schema

log = logging.getLogger("gpupool.control")

DB_DOWN = (
    "the database is unavailable ({detail}); the server retries by itself: try again in a "
    "few seconds, and check that PostgreSQL is running if this persists"
)


def is_db_down(exc: BaseException) -> bool:
    """True for errors that mean "cannot reach the database" rather than "bad query"."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError):
        if getattr(exc.orig, "sqlstate", None) == "55P03":  # PostgreSQL: lock_timeout passed
            return False
        message = str(exc.orig).lower() if exc.orig is not None else ""
        # SQLite's "database is locked" is contention, not an outage; everything else is.
        return "locked" not in message
    return False


class ControlPlane:
    """Store, clock and settings, shared by every service in one server process."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        clock: Clock | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.engine = engine or make_engine(
            settings.database_url, application_name=f"gpupool-server {settings.server_id}"
        )
        self.sessions = session_factory(self.engine)
        self.read_sessions = session_factory(self.engine.execution_options(**{READ_ONLY: True}))
        self.wakeup = threading.Event()
        self.orders = OrderBoard()  # new starts/stops per node, for agents' long polls
        # this process, in the notices it sends other processes (see store/notify.py)
        self.origin = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._listener: Listener | None = None
        self.admission = Admission()  # agents' calls in flight, shed, heard; the server's lag
        self.settled = SettledNodes(clock=self.clock.monotonic)  # quiet heartbeats, from memory
        self.reports = ReportBook()  # agents' acknowledged reports, to expand their deltas
        self._write_gate = threading.Lock()
        self.epoch = 0  # the leader epoch this server holds (0 = not leader)
        # In-memory copies for the hot path; services that change what they hold clear them.
        self.principals = PrincipalCache(settings.auth_cache_s)
        self.catalog = Catalog(settings.catalog_cache_s)
        # --mail-type notices: staged in the moving transaction, sent by the notifier's thread
        self.notifier = Notifier(settings, self.tx)

    @property
    def sqlite(self) -> bool:
        return is_sqlite(self.settings.database_url)

    def prepare(self) -> str:
        """Check (and on an empty database create) the schema; returns its revision."""
        return ensure_schema(self.engine, allow_migrate=self.settings.migrate)

    def now(self) -> float:
        return self.clock.now()

    def poke(self) -> None:
        """Wake the scheduling loop (after a submit, a finish, a node change)."""
        self.wakeup.set()

    def read(self) -> AbstractContextManager[Session]:
        """A read-only transaction (see :meth:`tx`)."""
        return self.tx(read_only=True)

    @contextmanager
    def tx(self, *, read_only: bool = False) -> Iterator[Session]:
        """A transaction: commits on success, rolls back on error; DB outages become 503.

        ``read_only`` transactions must not write; on SQLite they do not take the write lock.
        """
        factory = self.read_sessions if read_only else self.sessions
        # SQLite has one writer at a time; queueing writers on a lock here is fairer and much
        # faster than letting them spin in SQLite's busy handler (which sleeps up to 100 ms).
        gate = self._write_gate if self.sqlite and not read_only else contextlib.nullcontext()
        staged = False
        try:
            with gate, factory() as session:
                with session.begin():
                    yield session
                    if not read_only:
                        bump_versions(session)  # other processes learn of the new orders
                        self._publish(session)
                        staged = stage(session, self.settings.mail_webhook)  # --mail-type
                        if staged and not self.sqlite:  # other replicas' senders look too
                            send(session, NOTICES_CHANNEL, self.origin)
                # committed: agents waiting for these nodes' orders may fetch them now
                nodes = session.info.pop(ORDER_NODES, None)
                if nodes:
                    self.orders.announce(nodes)
                if staged:  # --mail-type: the notifier's thread sends them, never this one
                    self.notifier.wake()
        except (OperationalError, DBAPIError, PoolTimeout) as exc:
            if is_db_down(exc):
                detail = type(exc.orig).__name__ if isinstance(exc, DBAPIError) else "timeout"
                log.warning("database unavailable: %s", exc)
                raise Unavailable(DB_DOWN.format(detail=detail)) from exc
            raise

    # ------------------------------------------------------------------ other processes' orders
    def _publish(self, session: Session) -> None:
        """PostgreSQL: tell the other server processes which nodes this transaction gives
        orders, so an agent long-polling one of them hears at once (delivered on commit)."""
        nodes = session.info.get(ORDER_NODES)
        if nodes and not self.sqlite:
            publish(session, ORDERS_CHANNEL, self.origin, nodes)

    def _heard(self, payload: str) -> None:
        notice = parse(payload)
        if notice is not None and notice[0] != self.origin:
            self.orders.announce(notice[1])

    def _notices(self, payload: str) -> None:
        if payload != self.origin:
            self.notifier.wake()

    def _woken(self, payload: str) -> None:
        if payload != self.origin and self.epoch > 0:
            self.poke()

    def wake_leader(self) -> None:
        """PostgreSQL: wake the leader's scheduling loop (this process was poked and does not
        lead: a submit or an end through it). No-op on SQLite (one process)."""
        if not self.sqlite:
            with self.tx() as s:
                send(s, WAKE_CHANNEL, self.origin)

    def start_listening(self) -> Listener | None:
        """PostgreSQL: listen for the orders other processes commit (a thread of its own,
        until :meth:`stop_listening`), which wake this process's long polls for their nodes,
        and, while this process leads, for other processes' wake-ups of its loop; and for the
        notices other processes commit, which wake this process's notifier. Starts the
        notifier (on SQLite too)."""
        self.notifier.start()
        if self.sqlite or self._listener is not None:
            return self._listener
        handlers = {
            ORDERS_CHANNEL: self._heard,
            WAKE_CHANNEL: self._woken,
            NOTICES_CHANNEL: self._notices,
        }
        self._listener = Listener(self.settings.database_url, handlers)
        self._listener.start()
        return self._listener

    def stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    def ping(self) -> bool:
        """True when the database answers."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except (OperationalError, DBAPIError, PoolTimeout):
            return False

    def close(self) -> None:
        self.notifier.close()
        self.stop_listening()
        self.engine.dispose()
