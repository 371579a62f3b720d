"""The one clock.

Every time gpupool uses comes from a :class:`Clock` passed in: :class:`SystemClock` in
production, :class:`ManualClock` in the simulator and in tests. Nothing else reads
``time.time()``. Times are float seconds since the Unix epoch (or since the simulation start).

The two clocks live in :mod:`gpupool.domain.clocks`, which imports no ``typing``, so that the
per-replica supervisor, a fresh interpreter on every job start, reads the real clock cheaply;
this module adds the :class:`Clock` protocol they satisfy and re-exports them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpupool.domain.clocks import ManualClock, SystemClock

__all__ = ["Clock", "ManualClock", "SystemClock"]


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
