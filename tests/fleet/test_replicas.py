"""Replicas that share the load (issue 26), along the user's path: two real ``gpupool server``
processes on one PostgreSQL database and a real ``gpupool agent``.

- An agent that long-polls the standby hears of its start order as soon as the leader commits
  it (a PostgreSQL notice from the leader wakes the standby's poll), not at its next heartbeat;
  and a job submitted through the standby is scheduled at once (the standby wakes the leader's
  loop). Heartbeats here come every 60 s, so a start that waited for one would take about a
  minute; the test allows 40 s (a loaded machine takes a few seconds; the benchmark figures
  are in docs/benchmarks.md).
- An agent given both servers' URLs keeps its job running, its node up, while the server it
  used is frozen (SIGSTOP) and then while the other one is killed: it moves to the replica that
  answers. Whichever of the two it started on, one of the phases takes its server away.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server_proc import ServerProcess
from tests.e2e.pool import wait_for
from tests.fleet.replicas import Replicas, leads, running
from tests.store.fixtures import db_url, pg_database

__all__ = ["db_url", "pg_database"]

#: Replicas share one PostgreSQL store; ``db_url`` empties the session's database per test.
pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]

LEASE_S = 3.0
SLOW_BEATS = ("--leader-lease", str(LEASE_S), "--heartbeat", "60", "--node-timeout", "240")
#: The agent's requests time out after 10 s and its fence trips at half the node timeout:
#: 30 s leaves it room to move to the other replica first.
NODE_TIMEOUT_S = 30.0
FAILOVER = ("--leader-lease", str(LEASE_S), "--heartbeat", "1", "--node-timeout", "30")


@pytest.fixture
def slow_beats(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    with running(tmp_path, db_url, SLOW_BEATS) as pair:
        yield pair


@pytest.fixture
def failover(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    with running(tmp_path, db_url, FAILOVER, agent_on="ab") as pair:
        yield pair


def test_an_agent_polling_the_standby_gets_its_start_order_at_once(slow_beats: Replicas) -> None:
    pair = slow_beats
    assert leads(pair.a) == "yes"
    assert leads(pair.b) == "no"
    # submitted through the leader, which commits the start; the agent waits on the standby
    through_leader = pair.time_to_running(pair.a, "via-leader", 40)
    # submitted through the standby, which must wake the leader's idle loop
    through_standby = pair.time_to_running(pair.b, "via-standby", 40)
    print(
        f"submit -> RUNNING: via the leader {through_leader:.2f}s, standby {through_standby:.2f}s"
    )
    assert leads(pair.a) == "yes", "the leader changed: the test did not measure the standby"


def _heard_after(pair: Replicas, judge: ServerProcess, moment: float) -> bool:
    """Has ``judge`` (the server that leads now) recorded a heartbeat of n1 after ``moment``?"""
    try:
        r = pair.http.get(judge.url + "/v1/nodes/n1")
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and float(r.json()["last_heartbeat"]) > moment


def _keeps_running(pair: Replicas, job: str, judge: ServerProcess, stopped_at: float) -> None:
    """After a server stopped at ``stopped_at``: the agent's heartbeats reach ``judge`` (so it
    moved, if it used the stopped one), and for a whole node timeout the node stays up and the
    job RUNNING there."""
    wait_for(lambda: leads(judge) == "yes", 60, f"{judge.url} to lead")
    wait_for(
        lambda: _heard_after(pair, judge, stopped_at + 1.0),
        NODE_TIMEOUT_S * 3,
        "the agent to heartbeat the server that still runs",
    )
    deadline = time.monotonic() + NODE_TIMEOUT_S
    while time.monotonic() < deadline:
        assert pair.node_state(judge) in ("up", None), "node n1 was marked down"
        assert pair.state(judge, job) in ("RUNNING", None)
        time.sleep(1.0)
    assert pair.node_state(judge) == "up"
    assert pair.state(judge, job) == "RUNNING"


def test_an_agent_given_two_servers_keeps_running_when_one_stops(failover: Replicas) -> None:
    pair = failover
    assert pair.a.proc is not None
    assert pair.b.proc is not None
    job = pair.submit(pair.a, "keeps-running")
    wait_for(lambda: pair.state(pair.a, job) == "RUNNING", 90, "the job to run")

    # 1. the leader frozen: b takes over; the agent, if it used a, moves to b
    stopped_at = time.time()
    pair.a.proc.send_signal(signal.SIGSTOP)
    try:
        _keeps_running(pair, job, pair.b, stopped_at)
    finally:
        pair.a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: leads(pair.a) == "no", 60, "the resumed server to step down")

    # 2. the new leader killed: a takes over; the agent, if it used b, moves to a
    stopped_at = time.time()
    pair.b.kill()
    _keeps_running(pair, job, pair.a, stopped_at)
    # one assignment, never stopped: the job was not failed over
    assert pair.assignments() == [(job, None)]
