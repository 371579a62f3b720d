"""The injected clock: real and manual."""

from __future__ import annotations

import pytest

from gpupool.control.machinery.clock import Clock, ManualClock, SystemClock


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(100.0)
    assert clock.now() == 100.0
    clock.sleep(5)
    assert clock.now() == 105.0
    assert clock.advance(2.5) == 107.5
    clock.set(200)
    assert clock.monotonic() == 200


def test_manual_clock_never_goes_back() -> None:
    clock = ManualClock(10)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="cannot set the clock back"):
        clock.set(5)


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(ManualClock(), Clock)
    real = SystemClock()
    first = real.monotonic()
    real.sleep(0)
    assert real.monotonic() >= first
    assert real.now() > 1.6e9
