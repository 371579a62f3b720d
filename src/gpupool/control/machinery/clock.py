"""The one clock, as the control plane names it: :mod:`gpupool.domain.clock` re-exported.

The clock lives in the domain layer so that the SDK and the CLI, which need the real clock, do
not import the control plane (``gpupool queue`` stays light, see :mod:`gpupool.cli.commands`).
"""

from __future__ import annotations

from gpupool.domain.clock import Clock, ManualClock, SystemClock

__all__ = ["Clock", "ManualClock", "SystemClock"]
