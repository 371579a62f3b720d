"""End to end: node identity (issue 17 item 4).

- a second live agent claiming a node's name (what happens when an agent starts without
  ``--node`` on a machine with the same host name) is refused with what to do, and the node
  keeps its own devices;
- devices an agent no longer reports leave the node;
- an operator removes a down node with ``gpupool nodes delete NAME`` (audited), refused with
  what to do while the node is up.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from tests.e2e.pool import PY, Pool, wait_for


@pytest.fixture
def short_pool(tmp_path: Path) -> Iterator[Pool]:
    p = Pool(tmp_path, node_timeout_s=4.0)
    try:
        p.start_server()
        p.start_agent("n1", "2xA100-80GB")
        yield p
    finally:
        p.close()


def _second_agent(pool: Pool, node: str, state: Path, spec: str) -> subprocess.Popen[bytes]:
    log = open(pool.root / f"second-{node}.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [
            PY,
            "-m",
            "gpupool.cli",
            "agent",
            "--server",
            pool.url,
            "--token-file",
            str(pool.agent_token),
            "--simulate",
            spec,
            "--node",
            node,
            "--state-dir",
            str(state),
            "--address",
            "127.0.0.2",
        ],
        env=pool._env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _cli(pool: Pool, *args: str) -> tuple[int, str]:
    token = (pool.home / "admin-token").read_text().strip()
    env = {"GPUPOOL_SERVER": pool.url, "GPUPOOL_TOKEN": token, "COLUMNS": "200"}
    r = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return r.exit_code, r.stdout + r.stderr


def test_a_second_live_agent_with_the_same_node_name_is_refused_and_merges_nothing(
    short_pool: Pool,
) -> None:
    pool = short_pool
    before = sorted(d["uuid"] for d in pool.node("n1")["devices"])  # type: ignore[index]
    second = _second_agent(pool, "n1", pool.root / "other-machine", "4xT4")
    code = second.wait(timeout=120)
    output = (pool.root / "second-n1.log").read_text()
    assert code != 0, output
    assert "already served by a live agent" in output, output
    assert "--node" in output, output
    node = pool.node("n1")
    assert node is not None
    assert node["state"] == "up"
    assert sorted(d["uuid"] for d in node["devices"]) == before
    assert {d["model"] for d in node["devices"]} == {"NVIDIA A100-SXM4-80GB"}


def test_devices_an_agent_no_longer_reports_leave_the_node(short_pool: Pool) -> None:
    pool = short_pool
    assert len(pool.node("n1")["devices"]) == 2  # type: ignore[index]
    pool.kill_agent("n1")
    pool.start_agent("n1", "1xA100-80GB")  # same state folder: the same agent, one GPU less
    wait_for(lambda: len(pool.node("n1")["devices"]) == 1, 60, "the lost GPU to leave")  # type: ignore[index]
    assert len(pool.get("/v1/devices")) == 1


def test_gpupool_nodes_delete_removes_a_down_node_and_refuses_an_up_one(short_pool: Pool) -> None:
    pool = short_pool
    code, out = _cli(pool, "nodes", "delete", "n1")
    assert code != 0
    assert "only a down node can be deleted" in out, out
    assert "gpupool drain n1" in out, out
    assert pool.node("n1") is not None
    pool.kill_agent("n1")
    wait_for(lambda: (pool.node("n1") or {}).get("state") == "down", 60, "n1 marked down")
    code, out = _cli(pool, "nodes", "delete", "n1")
    assert code == 0, out
    assert "node n1 deleted" in out
    assert pool.node("n1") is None
    assert pool.get("/v1/devices") == []
    code, out = _cli(pool, "nodes", "delete", "n1")
    assert code != 0
    assert "not found" in out
    assert "gpupool nodes" in out
    actions = [(a["action"], a["target"]) for a in pool.get("/v1/audit")]
    assert ("node.delete", "n1") in actions
