"""Leadership: only one server schedules, a frozen one is replaced, and a deposed one cannot write.

Words:

- **lease**: the row ``leader`` (id 1) in the store says which epoch leads and until when
  (``expires``, wall-clock seconds). The leader renews it every ``leader_lease_s / 3`` seconds
  from a thread of its own (so a long scheduling cycle does not let it lapse); a standby takes
  it when ``expires`` has passed. A leader that is frozen (SIGSTOP, a long GC or swap pause,
  a partition from the store) stops renewing and is replaced within ``leader_lease_s``. A leader
  that stops cleanly clears ``expires`` so a standby takes over at its next tick.
- **epoch**: on taking the lease a server increments ``leader.epoch`` and remembers the value.
  Every scheduling commit re-reads the row (``SELECT ... FOR UPDATE``; SQLite: under the write
  lock of ``BEGIN IMMEDIATE``) and aborts when the epoch is not its own, so a server that lost its
  lease without noticing cannot commit a stale decision. The epoch, not the clock, is what keeps
  decisions single: servers' clocks only decide *when* a standby takes over (keep them in step,
  NTP, to well within the lease).
- **step down**: a leader that finds another epoch in the row, or that could not renew for a
  whole lease (its own monotonic clock says so, whatever the store's row holds), stops leading
  and becomes a standby; a resumed frozen leader does so before it acts again (its lease is
  older than half a lease, so :meth:`Leadership.try_acquire` renews first and finds it lost).
- **frozen holder** (PostgreSQL): a leader frozen inside a transaction (a scheduling commit,
  a renewal) holds the lease row's lock, and a standby's ``FOR UPDATE`` would wait behind it
  until PostgreSQL ends the idle transaction (``IDLE_IN_TRANSACTION_S``, a minute): no one
  would schedule or judge silent nodes meanwhile. So a standby that finds the lease lapsed
  waits at most ``lock_wait_s`` for the row, then ends (``pg_terminate_backend``) the store
  sessions that hold it and have sat idle inside their transaction for ``frozen_after_s`` or
  more, and takes the lease. Whatever the frozen server was about to commit is rolled back
  with its session; when it wakes its next statement fails and its renewal finds the new
  epoch, so it steps down (the epoch stays the fence; this only stops the wait).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader, Unavailable
from gpupool.store.models import LeaderModel

log = logging.getLogger("gpupool.control.machinery.leader")

_STORE_ERRORS = (Unavailable, OperationalError, DBAPIError)
#: The renewal (:meth:`Leadership._renew`): matches the row only while the epoch is ours.
_RENEW = text("UPDATE leader SET expires = :expires WHERE id = 1 AND epoch = :epoch")
#: PostgreSQL's SQLSTATE for a lock not granted within ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"
#: Store sessions that hold the lease row (its table's row-share lock, which ``FOR UPDATE``
#: takes) and have been idle inside their transaction for ``:idle`` seconds or more.
_FROZEN_HOLDERS = text(
    """
    SELECT a.pid, coalesce(a.application_name, ''),
           extract(epoch FROM now() - a.state_change) AS idle_s
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.relation = 'leader'::regclass
      AND l.mode = 'RowShareLock' AND l.granted
      AND a.pid <> pg_backend_pid()
      AND a.state LIKE 'idle in transaction%'
      AND a.state_change <= now() - make_interval(secs => :idle)
    """
)


class _RowLocked(Exception):
    """The lease row stayed locked past ``Leadership.lock_wait_s``."""


class Leadership:
    """This server's claim on the scheduling lease (see the module docstring)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.lease_s = cp.settings.leader_lease_s
        #: How long a standby waits for the lapsed lease's row before it looks for a frozen
        #: holder, and how long that holder must have been idle in its transaction.
        self.lock_wait_s = min(1.0, self.lease_s / 3)
        self.frozen_after_s = self.lease_s / 3
        self._renewed = 0.0  # monotonic time of the last successful take or renewal
        self._lock = threading.Lock()  # one take/renew/release at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.cp.epoch > 0

    # ------------------------------------------------------------------ take, renew, release
    def try_acquire(self) -> bool:
        """Lead if we do (renewing a lease older than half its length first), or take the
        lease if it has expired (bumping the epoch). Returns whether this server leads."""
        with self._lock:
            if self.is_leader:
                if self.cp.clock.monotonic() - self._renewed >= self.lease_s / 2:
                    return self._renew()
                return True
            return self._take()

    def renew(self) -> bool:
        """Extend our lease now; steps down (and returns False) when it is no longer ours."""
        with self._lock:
            return self.is_leader and self._renew()

    def check(self) -> bool:
        """Still leading? (Renews when due; see :meth:`try_acquire`.)"""
        return self.try_acquire() if self.is_leader else False

    def _take(self) -> bool:
        started = self.cp.clock.monotonic()
        try:
            # A read first: a standby asks every tick, and most of the time the lease is held,
            # which needs no write lock (SQLite has one for the whole store) to find out.
            with self.cp.read() as s:
                held = s.get(LeaderModel, 1)
                if held is not None and held.expires > self.cp.now():
                    return False
            try:
                taken = self._claim()
            except _RowLocked:
                if not self._end_frozen_holders():
                    log.info("the lapsed scheduling lease's row is locked; will retry")
                    return False
                taken = self._claim()  # the frozen holder's lock went with its session
        except (_RowLocked, *_STORE_ERRORS) as exc:
            log.warning("could not take the scheduling lease: %s", exc)
            return False
        if taken is None:
            return False
        epoch, previous = taken
        self.cp.epoch = epoch
        self._renewed = started
        after = f" (after {previous})" if previous else ""
        log.info("this server leads scheduling, epoch %d%s", epoch, after)
        return True

    def _claim(self) -> tuple[int, str] | None:
        """Take the lapsed lease in one transaction: ``(epoch, previous holder)``, or
        ``None`` when another server's lease is in force. Raises :class:`_RowLocked` when
        its row stayed locked for ``lock_wait_s`` (PostgreSQL: see "frozen holder" in the
        module docstring)."""
        try:
            with self.cp.tx() as s:
                if not self.cp.sqlite:
                    wait_ms = max(1, int(self.lock_wait_s * 1000))
                    s.execute(text(f"SET LOCAL lock_timeout = {wait_ms}"))
                row = s.get(LeaderModel, 1, with_for_update=True)
                if row is None:
                    row = LeaderModel(id=1, epoch=0, holder="", since=0.0, expires=0.0)
                    s.add(row)
                now = self.cp.now()
                if row.expires > now:
                    return None  # another server's lease is in force
                previous = row.holder
                row.epoch += 1
                row.holder = self.cp.settings.server_id
                row.since = now
                row.expires = now + self.lease_s
                return row.epoch, previous
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise _RowLocked(f"the lease row stayed locked for {self.lock_wait_s:g}s") from exc
            raise

    def _end_frozen_holders(self) -> bool:
        """End the store sessions that hold the lapsed lease's row while idle in their
        transaction for ``frozen_after_s`` or more (a frozen server's); returns whether any
        was ended. Only called when the lease has lapsed and its row stayed locked."""
        with self.cp.tx() as s:
            held = s.execute(_FROZEN_HOLDERS, {"idle": self.frozen_after_s}).all()
            ended = False
            for pid, application, idle_s in held:
                if s.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}):
                    ended = True
                    log.warning(
                        "ended store session %d (%s) that held the lapsed scheduling lease "
                        "while idle in its transaction for %.0fs (a frozen server): "
                        "taking over scheduling",
                        pid,
                        application or "no application name",
                        float(idle_s),
                    )
        return ended

    def _renew(self) -> bool:
        """Extend the lease by one statement, ``UPDATE ... WHERE epoch = ours`` (it matches
        no row when another server took over); the row is read only then, to say whose it
        is. No ORM object is loaded or flushed: an idle leader renews twelve times a minute,
        and the ORM's get-modify-flush cost it about twice the CPU of this."""
        started = self.cp.clock.monotonic()
        try:
            with self.cp.tx() as s:
                params = {"expires": self.cp.now() + self.lease_s, "epoch": self.cp.epoch}
                renewed = s.connection().execute(_RENEW, params).rowcount == 1
                lost = "" if renewed else self._taken_by(s)
        except _STORE_ERRORS as exc:
            if started - self._renewed < self.lease_s:
                log.warning("could not renew the scheduling lease (will retry): %s", exc)
                return True
            lost = f"not renewed for {started - self._renewed:.0f}s ({exc})"
        if lost:
            epoch = self.cp.epoch
            log.warning("lost the scheduling lease, epoch %d: %s; stepping down", epoch, lost)
            self.cp.epoch = 0
            return False
        self._renewed = started
        return True

    @staticmethod
    def _taken_by(session: Session) -> str:
        """Who holds the lease now that ours could not be renewed, as a phrase."""
        row = session.get(LeaderModel, 1)
        if row is None:
            return "epoch 0 of nobody took over"
        return f"epoch {row.epoch} of {row.holder} took over"

    def release(self) -> None:
        """Stop leading; when the lease is still ours, end it so a standby takes over now."""
        with self._lock:
            epoch, self.cp.epoch = self.cp.epoch, 0
            if epoch <= 0:
                return
            try:
                with self.cp.tx() as s:
                    row = s.get(LeaderModel, 1, with_for_update=True)
                    if row is not None and row.epoch == epoch:
                        row.expires = 0.0
            except _STORE_ERRORS as exc:
                log.warning("could not end the scheduling lease (it expires by itself): %s", exc)

    # ------------------------------------------------------------------ background renewal
    def start_renewing(self) -> None:
        """Renew the lease every ``lease_s / 3`` seconds from a thread of its own whenever this
        server leads, until :meth:`stop_renewing` (real time; tests with a manual clock call
        :meth:`renew` instead)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="gpupool-lease", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if self.is_leader and not self.renew():
                self.cp.poke()  # the loop notices at once that it no longer leads


def check_epoch(session: Session, epoch: int) -> None:
    """Raise :class:`NotLeader` unless ``epoch`` is still the one in force (locks the row)."""
    current = session.scalar(select(LeaderModel.epoch).where(LeaderModel.id == 1).with_for_update())
    if epoch <= 0 or current != epoch:
        raise NotLeader(
            f"this server's scheduling epoch {epoch} is not current ({current}): "
            "another server took over scheduling"
        )
