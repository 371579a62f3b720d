"""An idle agent sleeps (issue 26: the idle pool under 0.1 CPU-s a minute): with no replica it
heartbeats every third of the node timeout and its fence's watch sleeps until the fence could
be due; orders and a changed node timeout still wake them at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpupool.agent import pacing as pacing_module
from gpupool.agent.agent import Agent
from gpupool.agent.pacing import IDLE_FENCE_WAIT_S, IDLE_TICK_S
from gpupool.control.machinery.clock import ManualClock
from gpupool.schemas.agent import HeartbeatResponse
from tests.agent.helpers import wait_for
from tests.agent.test_agent import FakeServer, make_agent


def _count_calls(agent: Agent, method: str) -> list[float]:
    """Record when each call of the agent's ``method`` (no arguments, a bool) was made."""
    calls: list[float] = []
    real = getattr(agent, method)

    def counted() -> bool:
        calls.append(agent.clock.monotonic())
        return bool(real())

    setattr(agent, method, counted)
    return calls


def test_an_idle_agent_beats_every_third_of_the_node_timeout_but_at_once_for_orders(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    try:
        agent.register()
        agent.fence.node_timeout_s = None  # an older server tells no node timeout
        assert agent.spacing() == agent.interval_s
        agent.fence.node_timeout_s = 30.0
        assert agent.spacing() == 10.0  # idle: three beats per node timeout
        agent._beat_now.set()  # orders are waiting: the next beat is not put off
        assert agent.spacing() == agent.interval_s
        agent._beat_now.clear()
        agent.fence.node_timeout_s = 0.3  # a timeout shorter than three intervals
        assert agent.spacing() == agent.interval_s  # never more often than the interval
    finally:
        agent.close()


def test_an_idle_agents_fence_watch_sleeps_until_the_fence_could_be_due(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server, clock=ManualClock(1000.0))
    try:
        agent.register()
        now = agent.clock.monotonic()
        agent.fence.contact(now)
        agent.fence.node_timeout_s = 30.0  # due 15 s after the contact: the cap applies
        assert agent._fence_wait() == IDLE_FENCE_WAIT_S
        agent.fence.node_timeout_s = 6.0  # due 3 s after the contact
        assert agent._fence_wait() == 3.0
        agent.fence.node_timeout_s = 1.0  # due in 0.5 s: never a busy loop
        assert agent._fence_wait() == IDLE_TICK_S
        agent.fence.fenced = True  # nothing can be due until the next contact
        assert agent._fence_wait() == IDLE_FENCE_WAIT_S
    finally:
        agent.close()


def test_a_changed_node_timeout_wakes_the_sleeping_fence_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its idle sleep made an hour: only the nudge can make it look again within the test.
    monkeypatch.setattr(pacing_module, "IDLE_FENCE_WAIT_S", 3600.0)
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    stop = threading.Event()
    checks = _count_calls(agent, "check_fence")
    watch = threading.Thread(target=agent._watch_fence, args=(stop,), daemon=True)
    try:
        agent.register()
        agent.fence.node_timeout_s = 600.0
        agent.fence.contact(agent.clock.monotonic())
        watch.start()
        agent.handle(
            HeartbeatResponse(epoch=agent.epoch, heartbeat_interval_s=0.2, node_timeout_s=2.0)
        )
        wait_for(lambda: checks, what="the fence checked after the node timeout changed")
        assert agent.fence.node_timeout_s == 2.0
    finally:
        stop.set()
        agent._fence_nudge.set()
        watch.join(timeout=20)
        agent.close()


def test_an_idle_agents_loop_sleeps_until_its_next_beat_and_a_stop_wakes_it(
    tmp_path: Path,
) -> None:
    # A 300 s node timeout: with no replica the next beat is 100 s away. The loop used to look
    # at its replicas once a second meanwhile; now nothing wakes it but its beat, the long
    # poll or the stop, which must still end it at once.
    server = FakeServer()
    server.queue = [
        HeartbeatResponse(epoch=1, heartbeat_interval_s=0.2, node_timeout_s=300.0)
        for _ in range(10)
    ]
    agent = make_agent(tmp_path, server)
    rounds = _count_calls(agent, "observe")
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    try:
        loop.start()
        # its first round: a look, the beat, a look after it; then it sleeps
        wait_for(lambda: len(rounds) >= 2 and agent.spacing() == 100.0, what="a quiet beat")
        before = len(rounds)
        stop.wait(3.0)  # three of the old idle ticks
        assert len(rounds) == before  # not one look at the loop in between
        assert len(server.requests) == 1
    finally:
        stop.set()
        loop.join(timeout=30)
        agent.close()
    assert not loop.is_alive()  # the stop woke the sleeping loop
