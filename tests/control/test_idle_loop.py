"""The idle pool sleeps (issue 26): a leading scheduling loop with nothing pending sleeps
until the first moment a node could time out, not one tick; pending work keeps the tick."""

from __future__ import annotations

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import IDLE_WAIT_S, SchedulingLoop
from gpupool.control.services.jobs import JobService
from tests.control.builders import ADMIN, heartbeat, register


def test_an_idle_leader_sleeps_until_a_node_could_time_out(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1")
    loop = SchedulingLoop(cp)
    try:
        last = loop.run_once()
        assert last is not None
        assert last.pending == 0
        wait = loop.idle_wait_s(last)
        # grace after taking the lead: nobody is judged before a whole node timeout
        assert wait == min(IDLE_WAIT_S, cp.settings.node_timeout_s)
        clock.advance(cp.settings.node_timeout_s)
        heartbeat(cp, "n1")
        clock.advance(5)
        last = loop.run_once()
        assert loop.idle_wait_s(last) == cp.settings.node_timeout_s - 5  # n1's deadline
        spec = {"name": "big", "command": ["true"], "resources": {"gpus": 8}}
        JobService(cp).submit(ADMIN, spec, queue_anyway=True)  # no room: it stays pending
        last = loop.run_once()
        assert last is not None
        assert last.pending == 1
        assert loop.idle_wait_s(last) == cp.settings.tick_s
    finally:
        loop.leadership.release()


def test_a_standby_keeps_ticking_to_take_over_a_lapsed_lease(cp: ControlPlane) -> None:
    loop = SchedulingLoop(cp)
    assert loop.idle_wait_s(None) == cp.settings.tick_s
