"""The agent id that tells the server which agent speaks for a node (issue 17 item 4)."""

from __future__ import annotations

from pathlib import Path

from gpupool.agent.node import agent_identity
from tests.agent.test_agent import FakeServer, make_agent


def test_one_state_folder_keeps_one_id_and_another_folder_gets_another(tmp_path: Path) -> None:
    first = agent_identity(tmp_path / "a")
    assert agent_identity(tmp_path / "a") == first  # a restarted agent is the same agent
    assert agent_identity(tmp_path / "b") != first
    (tmp_path / "a" / "agent-id").write_text("not an id\n")
    fresh = agent_identity(tmp_path / "a")
    assert fresh != first
    assert len(fresh) == 32


def test_the_agent_sends_its_id_when_it_registers(tmp_path: Path) -> None:
    server = FakeServer()
    agent = make_agent(tmp_path, server)
    try:
        assert agent.register_request().agent_id == agent_identity(agent.config.state_dir)
    finally:
        agent.close()
