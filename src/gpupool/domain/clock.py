"""The one clock.

Every time gpupool uses comes from a :class:`Clock` passed in: :class:`SystemClock` in
production, :class:`ManualClock` in the simulator and in tests. Nothing else reads
``time.time()``. Times are float seconds since the Unix epoch (or since the simulation start).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Where time comes from."""

    def now(self) -> float:
        """Wall-clock seconds (epoch for real clocks, simulation time for manual ones)."""
        ...

    def monotonic(self) -> float:
        """Seconds that never go backwards, for timeouts and durations."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a manual clock advances instead of waiting)."""
        ...


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
