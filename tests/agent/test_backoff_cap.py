"""The agent's reconnect backoff stays below the server's node timeout (issue 18 item 4): it is
capped at the heartbeat interval the server gives, so an agent is back within the grace the
server allows after a restart or a store outage."""

from __future__ import annotations

from pathlib import Path

from gpupool.agent.transport import Backoff
from tests.agent.test_agent import FakeServer, make_agent


def test_backoff_never_waits_longer_than_its_cap_however_long_the_outage() -> None:
    backoff = Backoff(seed=3)
    backoff.cap_at(0.5)
    delays = [backoff.next_delay() for _ in range(200)]
    assert max(delays) <= 0.5
    assert min(delays[5:]) >= 0.25  # jitter keeps at least half the cap once it is reached


def test_the_default_cap_is_far_below_the_default_node_timeout() -> None:
    backoff = Backoff(seed=1)
    assert max(backoff.next_delay() for _ in range(100)) <= 5.0  # node timeout: 30 s


def test_an_agent_caps_its_retries_at_the_servers_heartbeat_interval(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    try:
        agent.register()
        assert agent.interval_s == 0.2
        assert agent.backoff.cap_s == 0.2
    finally:
        agent.close()
