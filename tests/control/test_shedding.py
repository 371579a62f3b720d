"""Load shedding of the agents' calls (issue 26): a busy server answers registrations and
heartbeats ``503`` with a spread ``Retry-After`` instead of queueing them, counts a shed
heartbeat as a sign of life, and extends the node timeout by its own lag, so it never marks
a node down for its own slowness."""

from __future__ import annotations

from sqlalchemy import select

from gpupool.api.shedding import store_pool_has_room
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.admission import Admission
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.nodes import NodeService
from gpupool.store.models import EventModel, NodeModel
from tests.api.helpers import make_api
from tests.control.builders import heartbeat, register


def test_calls_over_the_limit_are_shed_and_told_to_come_back_at_spread_times() -> None:
    now = [100.0]
    admission = Admission({"register": 1, "heartbeat": 1}, clock=lambda: now[0], seed=3)
    assert admission.try_enter("register")
    assert not admission.try_enter("register")  # one in flight: the next is shed
    assert admission.try_enter("heartbeat")  # kinds are counted apart
    for _ in range(200):
        admission.try_enter("register")  # a booting rack knocks again and again
    waits = {admission.retry_after("register") for _ in range(200)}
    assert min(waits) >= 1
    assert max(waits) <= 15  # RETRY_CAP_S
    assert len(waits) > 8  # spread, not one number for everybody
    assert max(admission.retry_after("heartbeat", cap_s=5.0) for _ in range(50)) <= 5
    admission.leave("register", 0.1)
    assert admission.try_enter("register")  # room again


def test_a_shed_heartbeat_is_answered_503_and_still_keeps_its_node_up(
    cp: ControlPlane, clock: ManualClock
) -> None:
    api = make_api(cp)
    agent = api.tokens["agent"]
    body = {"node": "n1", "epoch": 0}
    register(cp, "n1")
    register(cp, "n2")
    assert api.call(agent, "POST", "/v1/agent/heartbeat", body).status_code == 200  # cached
    cp.admission.limits["heartbeat"] = 0  # the server is busy from now on
    timeout = cp.settings.node_timeout_s
    nodes = NodeService(cp)
    for _ in range(4):
        clock.advance(timeout / 2)
        answer = api.client.post(
            "/v1/agent/heartbeat",
            json=body,
            headers={"Authorization": f"Bearer {agent}", "X-Gpupool-Node": "n1"},
        )
        assert answer.status_code == 503, answer.text
        assert 1 <= int(answer.headers["Retry-After"]) <= cp.settings.heartbeat_interval_s
        assert "retry after" in answer.json()["detail"]
        nodes.mark_silent_nodes_down(watching_since=0.0)
    with cp.read() as s:
        states = {n.name: n.state for n in s.scalars(select(NodeModel))}
        downs = [
            e.subject for e in s.scalars(select(EventModel).where(EventModel.kind == "node.down"))
        ]
    assert states == {"n1": "up", "n2": "down"}  # n2 said nothing at all: down, as before
    assert downs == ["n2"]


def test_a_shed_heartbeat_keeps_its_node_up_when_its_token_is_no_longer_in_memory(
    cp: ControlPlane, clock: ManualClock
) -> None:
    """A busy server sheds every heartbeat, and the cache entry of the agents' token runs
    out meanwhile (nothing renews it: the calls that would are shed). The shed heartbeats
    still count, once the token is checked in the store (a 5,000-node fleet on two replicas
    had nodes marked down so, docs/benchmarks.md)."""
    api = make_api(cp)
    agent = api.tokens["agent"]
    register(cp, "n1")
    cp.admission.limits["heartbeat"] = 0
    timeout = cp.settings.node_timeout_s
    nodes = NodeService(cp)
    for _ in range(4):
        clock.advance(timeout / 2)
        cp.principals.clear()  # the entry ran out
        answer = api.client.post(
            "/v1/agent/heartbeat",
            json={"node": "n1", "epoch": 0},
            headers={"Authorization": f"Bearer {agent}", "X-Gpupool-Node": "n1"},
        )
        assert answer.status_code == 503, answer.text
        assert nodes.mark_silent_nodes_down(watching_since=0.0) == []
    nodes.record_heard()  # the liveness batch's write (the judge writes them only to judge)
    with cp.read() as s:
        node = s.get(NodeModel, "n1")
        assert node is not None
        assert node.state == "up"
        assert node.last_heartbeat == clock.now()


def test_a_shed_heartbeat_without_a_known_token_proves_nothing(
    cp: ControlPlane, clock: ManualClock
) -> None:
    api = make_api(cp)
    register(cp, "n1")
    cp.admission.limits["heartbeat"] = 0
    clock.advance(cp.settings.node_timeout_s + 1)
    answer = api.client.post(
        "/v1/agent/heartbeat",
        json={"node": "n1", "epoch": 0},
        headers={"Authorization": "Bearer not-a-token", "X-Gpupool-Node": "n1"},
    )
    assert answer.status_code == 503
    assert NodeService(cp).mark_silent_nodes_down(watching_since=0.0) == ["n1"]


def test_the_node_timeout_is_extended_by_the_servers_own_lag(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    heartbeat(cp, "n1")
    nodes = NodeService(cp)
    clock.advance(cp.settings.node_timeout_s + 5)
    cp.admission.note_loop_lag(20.0)  # the server ran 20 s late: the silence may be its own
    assert nodes.mark_silent_nodes_down(watching_since=0.0) == []
    clock.advance(20.0)
    assert nodes.mark_silent_nodes_down(watching_since=0.0) == ["n1"]


def test_a_heartbeat_that_would_wait_for_a_store_connection_is_shed(cp: ControlPlane) -> None:
    api = make_api(cp)
    register(cp, "n1")
    pool = cp.engine.pool
    held = []
    try:
        while store_pool_has_room(cp):
            held.append(cp.engine.connect())  # everything else holds the store's connections
        answer = api.call(
            api.tokens["agent"], "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0}
        )
        assert answer.status_code == 503
        assert int(answer.headers["Retry-After"]) >= 1
        assert pool.checkedout() == len(held)  # it never asked for one
    finally:
        for conn in held:
            conn.close()
    answer = api.call(
        api.tokens["agent"], "POST", "/v1/agent/heartbeat", {"node": "n1", "epoch": 0}
    )
    assert answer.status_code == 200
