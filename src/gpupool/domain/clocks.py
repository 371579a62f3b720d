"""The clocks: :class:`SystemClock` (real) and :class:`ManualClock` (simulator and tests).

Both satisfy :class:`gpupool.domain.clock.Clock`; import them from there, except where start-up
time matters (the supervisor): this module needs only ``time`` and ``threading``, not
``typing``. Times are float seconds since the Unix epoch (or since the simulation start).
"""

from __future__ import annotations

import threading
import time


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it. Thread-safe."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.now()

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never backwards); returns the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards: advance by 0 or more seconds")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        """Jump to ``when``, which must not be in the past."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"cannot set the clock back from {self._now} to {when}")
            self._now = float(when)
