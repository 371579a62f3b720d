"""Admission of the agents' calls: bounded work in flight, shedding, and the server's own lag.

A rack of nodes booting at once used to bury the server: every registration and heartbeat
queued for a worker thread and a store connection, answers came later than the agents'
timeouts, the agents retried at once, and live nodes were marked down because the server could
not record their heartbeats in time. This module is what the server does instead.

Words:

- **kind**: a class of agent call with its own limit of requests **in flight** (admitted and
  not yet answered): ``register`` (costly: the node's whole inventory) and ``heartbeat``.
- **shed**: a call over its kind's limit, or one that would wait for a store connection (the
  pool nearly lent out), is answered ``503`` at once, before any store work,
  with a ``Retry-After`` (:meth:`Admission.retry_after`): a random whole number of seconds
  from 1 to about how long the server needs to serve the calls it shed recently, so the
  retries of a thousand agents spread out instead of coming back together.
- **heard**: a node whose heartbeat was shed is alive though nothing of it was recorded; the
  server keeps its name and time (:meth:`Admission.heard`) and writes them in one batched
  update a second later (``NodeService.record_heard``), so shedding never makes a node look
  silent.
- **lag**: how late this server is: the longest an admitted heartbeat took from arrival to
  answer (time waiting for a worker thread and the store included) and how late the event
  loop ran, both over a recent window (:meth:`Admission.lag`). A heartbeat is stamped when
  its transaction starts, so a server that is ``lag`` seconds behind stamps heartbeats up to
  that late; failure detection extends the node timeout by it (``mark_silent_nodes_down``),
  so a slow server does not mark nodes down for its own slowness.

- **news**: an agent call admitted, or a node heard: what the API's watch (``api/shedding.py``)
  sleeps until when it has nothing else to do (:attr:`Admission.on_news`), so an idle server
  does not wake once a second to find nothing.

Everything here is in memory and per process; it is thread-safe (the event loop admits, worker
threads and the scheduling loop read).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

#: Requests in flight per kind before the next is shed. A heartbeat spends most of its time
#: waiting on the store (a dozen round trips), so enough must be in flight to keep the cores
#: busy; fewer than the store's pool (10 + 20 overflow on PostgreSQL) and the worker threads
#: (40), so those never run dry for everything else. A registration costs ten times more.
DEFAULT_LIMITS: Mapping[str, int] = {"register": 6, "heartbeat": 20}
#: The window (seconds) over which lag and the shed rate are measured.
WINDOW_S = 10.0
#: The longest ``Retry-After`` (seconds) given for each kind; a heartbeat's is further capped
#: at the heartbeat interval by the caller (a shed heartbeat still counts as heard).
RETRY_CAP_S: Mapping[str, float] = {"register": 15.0, "heartbeat": 30.0}


class _Window:
    """Counts and maxima per whole second over the last ``WINDOW_S`` seconds."""

    def __init__(self) -> None:
        self._slots: deque[tuple[int, float]] = deque()

    def add(self, now: float, value: float, *, keep_max: bool = False) -> None:
        second = int(now)
        if self._slots and self._slots[-1][0] == second:
            old = self._slots[-1][1]
            self._slots[-1] = (second, max(old, value) if keep_max else old + value)
        else:
            self._slots.append((second, value))
        self._prune(now)

    def _prune(self, now: float) -> None:
        while self._slots and self._slots[0][0] < now - WINDOW_S:
            self._slots.popleft()

    def total(self, now: float) -> float:
        self._prune(now)
        return sum(v for _, v in self._slots)

    def peak(self, now: float) -> float:
        self._prune(now)
        return max((v for _, v in self._slots), default=0.0)


class Admission:
    """See the module docstring. ``clock`` is monotonic seconds (tests pass their own)."""

    def __init__(
        self,
        limits: Mapping[str, int] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.limits = dict(limits or DEFAULT_LIMITS)
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.limits, 0)
        self._done = {kind: _Window() for kind in self.limits}
        self._shed = {kind: _Window() for kind in self.limits}
        self._lag = _Window()
        self._unverified: dict[str, tuple[str, float]] = {}  # see heard_by_token
        self._heard: dict[str, float] = {}
        self._written: dict[str, float] = {}  # node -> heard time last written (store time)
        self.shed_total = dict.fromkeys(self.limits, 0)
        #: Called (from any thread, without the lock held) when a call is admitted or a node
        #: heard; ``None``: nobody listens.
        self.on_news: Callable[[], None] | None = None

    def _news(self) -> None:
        listener = self.on_news
        if listener is not None:
            listener()

    def try_enter(self, kind: str) -> bool:
        """Admit one call of ``kind`` (True), or count it shed (False)."""
        with self._lock:
            admitted = self._in_flight[kind] < self.limits[kind]
            if admitted:
                self._in_flight[kind] += 1
        if admitted:
            self._news()
            return True
        self.shed(kind)
        return False

    def shed(self, kind: str) -> None:
        """Count one call of ``kind`` shed (over its bound, or no store connection free)."""
        with self._lock:
            self._shed[kind].add(self._clock(), 1.0)
            self.shed_total[kind] += 1

    def leave(self, kind: str, seconds: float) -> None:
        """An admitted call of ``kind`` was answered after ``seconds`` in the server."""
        with self._lock:
            now = self._clock()
            self._in_flight[kind] -= 1
            self._done[kind].add(now, 1.0)
            if kind == "heartbeat":
                self._lag.add(now, seconds, keep_max=True)

    def in_flight(self, kind: str) -> int:
        with self._lock:
            return self._in_flight[kind]

    def busy(self) -> bool:
        """Whether any agent call is in flight (admitted, not yet answered)."""
        with self._lock:
            return any(self._in_flight.values())

    def note_loop_lag(self, seconds: float) -> None:
        """The event loop woke ``seconds`` later than it asked to."""
        with self._lock:
            self._lag.add(self._clock(), max(0.0, seconds), keep_max=True)

    def lag(self) -> float:
        """How late this server has been over the recent window (seconds; see the module
        docstring)."""
        with self._lock:
            return self._lag.peak(self._clock())

    def retry_after(self, kind: str, cap_s: float | None = None) -> int:
        """Whole seconds a shed caller should wait: random in [1, backlog], where the backlog
        is the calls shed over the window divided by the rate the server answered them (at
        least 1 per second), capped at ``RETRY_CAP_S`` and at ``cap_s``."""
        with self._lock:
            now = self._clock()
            shed = self._shed[kind].total(now)
            rate = max(1.0, self._done[kind].total(now) / WINDOW_S)
        cap = min(RETRY_CAP_S[kind], cap_s if cap_s is not None else math.inf)
        backlog = min(max(1.0, cap), max(2.0, shed / rate))
        return self._rng.randint(1, max(1, math.ceil(backlog)))

    def heard(self, node: str, when: float) -> None:
        """A heartbeat of ``node`` was shed at ``when`` (store time): it is alive."""
        with self._lock:
            if when > self._heard.get(node, 0.0):
                self._heard[node] = when
        self._news()

    def heard_by_token(self, node: str, digest: str, when: float) -> None:
        """A heartbeat of ``node`` was shed at ``when`` with a token not in the principal
        cache (its hash ``digest``): heard once the token is checked (``take_unverified``)."""
        with self._lock:
            kept = self._unverified.get(node)
            if kept is None or when > kept[1]:
                self._unverified[node] = (digest, when)
        self._news()

    def take_unverified(self) -> dict[str, tuple[str, float]]:
        """The nodes heard with a token still to check: node -> (token hash, when)."""
        with self._lock:
            taken, self._unverified = self._unverified, {}
            return taken

    def has_heard(self, every_s: float = 0.0, now: float | None = None) -> bool:
        """Whether a node heard is due to be written: any, or (with ``every_s``) one whose
        time was last written ``every_s`` or more before ``now`` (store time); or one heard
        with a token still to check."""
        with self._lock:
            if self._unverified:
                return True
            if every_s <= 0.0 or now is None:
                return bool(self._heard)
            return any(now - self._written.get(n, -math.inf) >= every_s for n in self._heard)

    def heard_due_in(self, every_s: float, now: float) -> float | None:
        """Seconds until :meth:`has_heard` (with ``every_s``) is first true (0 when it is);
        ``None`` while no node heard waits to be written."""
        with self._lock:
            if self._unverified:
                return 0.0  # a token to check: due now (see has_heard)
            if not self._heard:
                return None
            first = min(self._written.get(n, -math.inf) for n in self._heard) + every_s
        return max(0.0, first - now)

    def take_heard(self, every_s: float = 0.0, now: float | None = None) -> dict[str, float]:
        """The nodes heard and due to be written (see :meth:`has_heard`), with when; they are
        taken out, the others stay."""
        with self._lock:
            if every_s <= 0.0 or now is None:
                due, self._heard = self._heard, {}
            else:
                due = {
                    n: t
                    for n, t in self._heard.items()
                    if now - self._written.get(n, -math.inf) >= every_s
                }
                for n in due:
                    del self._heard[n]
            return due

    def written(self, heard: Mapping[str, float]) -> None:
        """``heard`` is in the store now."""
        with self._lock:
            self._written.update(heard)
            if len(self._written) > 4 * len(self._heard) + 100_000:
                self._written.clear()  # bounded: nodes come and go

    def give_back_heard(self, heard: Mapping[str, float]) -> None:
        """Put back what :meth:`take_heard` gave when it could not be written."""
        for node, when in heard.items():
            self.heard(node, when)
