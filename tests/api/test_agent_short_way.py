"""The agents' short way through the API (``gpupool.api.shortway``): a quiet heartbeat or a
long poll with a known agent token is answered before FastAPI's routing, with the bytes the
route would send; everything else (a malformed body or query, an unknown token, another role,
news) still goes through the route and its checks, answered as before, changing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from fastapi.routing import APIRouter

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.liveness import Liveness
from gpupool.control.services.nodes import NodeService
from gpupool.store.models import NodeModel
from tests.api.helpers import Api, make_api
from tests.api.test_permissions import AGENT_REG

BEAT: dict[str, Any] = {
    "node": "n1",
    "epoch": 1,
    "telemetry": [{"uuid": "n1-gpu0", "utilization_ratio": 0.5, "temperature_c": 50.0}],
    "replicas": [],
}


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    api = make_api(cp)
    assert api.call(api.tokens["agent"], "POST", "/v1/agent/register", AGENT_REG).status_code == 200
    return api


@contextmanager
def routed() -> Iterator[mock.MagicMock]:
    """Counts the requests that reach FastAPI's router."""
    with mock.patch.object(APIRouter, "__call__", autospec=True, side_effect=APIRouter.__call__):
        yield APIRouter.__call__  # type: ignore[misc]


def _last_heartbeat(cp: ControlPlane) -> float:
    Liveness(cp).flush()  # what quiet heartbeats left to write
    with cp.read() as s:
        node = s.get(NodeModel, "n1")
        assert node is not None
        return float(node.last_heartbeat)


def test_a_quiet_heartbeat_is_answered_before_the_router_with_the_routes_bytes(
    api: Api, cp: ControlPlane, clock: ManualClock
) -> None:
    agent = api.tokens["agent"]
    first = api.call(agent, "POST", "/v1/agent/heartbeat", BEAT)  # news: the route applies it
    assert first.status_code == 200, first.text
    clock.advance(5)
    with routed() as router:
        again = api.call(agent, "POST", "/v1/agent/heartbeat", BEAT)
    assert router.call_count == 0
    assert again.status_code == 200
    assert again.headers["content-type"] == "application/json"
    assert again.content == first.content
    assert _last_heartbeat(cp) == clock.now()  # heard, written in the batch


def test_a_malformed_heartbeat_still_gets_a_clear_422_and_changes_nothing(
    api: Api, cp: ControlPlane, clock: ManualClock
) -> None:
    agent = api.tokens["agent"]
    assert api.call(agent, "POST", "/v1/agent/heartbeat", BEAT).status_code == 200
    heard = _last_heartbeat(cp)
    clock.advance(5)
    bad_temperature = {**BEAT, "telemetry": [{**BEAT["telemetry"][0], "temperature_c": "hot"}]}
    cases = [
        ({**BEAT, "epoch": "one"}, "epoch"),
        (bad_temperature, "telemetry.0.temperature_c"),
        ({"epoch": 1}, "node"),
    ]
    for body, field in cases:
        answer = api.call(agent, "POST", "/v1/agent/heartbeat", body)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert [e["field"] for e in problem["errors"]] == [field], problem
        assert problem["detail"].startswith(f"the request is not valid: {field}: ")
    not_json = api.client.post(
        "/v1/agent/heartbeat",
        content=b'{"node": "n1", "epoch": 1',
        headers={"Authorization": f"Bearer {agent}", "Content-Type": "application/json"},
    )
    assert not_json.status_code == 422, not_json.text
    assert _last_heartbeat(cp) == heard  # none of them counted as heard
    assert api.call(agent, "POST", "/v1/agent/heartbeat", BEAT).status_code == 200
    assert _last_heartbeat(cp) == clock.now()  # a good one does


def test_tokens_are_checked_as_before(api: Api, cp: ControlPlane, clock: ManualClock) -> None:
    agent = api.tokens["agent"]
    assert api.call(agent, "POST", "/v1/agent/heartbeat", BEAT).status_code == 200
    heard = _last_heartbeat(cp)
    clock.advance(5)
    assert api.call("not-a-token", "POST", "/v1/agent/heartbeat", BEAT).status_code == 401
    member = api.call(api.tokens["member"], "POST", "/v1/agent/heartbeat", BEAT)
    assert member.status_code == 403, member.text
    assert "agent" in member.json()["detail"]
    assert _last_heartbeat(cp) == heard


def test_a_long_poll_is_answered_before_the_router_as_the_route_answers(api: Api) -> None:
    agent = api.tokens["agent"]
    path = "/v1/agent/nodes/n1/orders"
    routed_first = api.call(agent, "GET", f"{path}?since=-1&timeout=0&x=1")  # the route
    assert routed_first.status_code == 200, routed_first.text
    with routed() as router:
        moved = api.call(agent, "GET", f"{path}?since=-1&timeout=0")
        seq = moved.json()["seq"]
        waited = api.call(agent, "GET", f"{path}?since={seq}&timeout=0.05")
    assert router.call_count == 0
    assert moved.content == routed_first.content
    assert moved.json() == {"seq": seq, "changed": True}
    assert waited.json() == {"seq": seq, "changed": False}
    assert waited.headers["content-type"] == "application/json"


def test_a_bad_long_poll_query_or_token_is_refused_as_before(api: Api) -> None:
    agent = api.tokens["agent"]
    path = "/v1/agent/nodes/n1/orders"
    for query, field in (
        ("since=abc", "since"),
        ("timeout=61", "timeout"),
        ("timeout=nan", "timeout"),
        ("since=-2&timeout=0", "since"),
    ):
        answer = api.call(agent, "GET", f"{path}?{query}")
        assert answer.status_code == 422, (query, answer.text)
        assert [e["field"] for e in answer.json()["errors"]] == [f"query.{field}"], answer.text
    assert api.call("not-a-token", "GET", f"{path}?timeout=0").status_code == 401
    assert api.call(api.tokens["member"], "GET", f"{path}?timeout=0").status_code == 403


def test_a_node_asked_for_its_full_state_counts_as_heard_while_its_full_beats_are_shed(
    api: Api, cp: ControlPlane, clock: ManualClock
) -> None:
    """A node that moved to this replica sends deltas against a base it does not hold and is
    asked for its full state; a busy server then sheds the full heartbeats. The node is
    talking all along: it must not be judged silent (a 5,000-node fleet on two replicas lost
    nodes so, docs/benchmarks.md)."""
    agent = api.tokens["agent"]
    assert api.call(agent, "POST", "/v1/agent/heartbeat", BEAT).status_code == 200
    timeout = cp.settings.node_timeout_s
    delta = {**BEAT, "seq": 7, "base": 6, "agent_id": "0123456789abcdef"}
    for _ in range(3):
        clock.advance(timeout / 2)
        answer = api.call(agent, "POST", "/v1/agent/heartbeat", delta)
        assert answer.status_code == 200, answer.text
        assert answer.json()["want_full"] is True
        # ... and the full heartbeat it sends next is shed (the server is busy): nothing else
        # is heard of it.
    assert NodeService(cp).mark_silent_nodes_down(watching_since=0.0) == []
    assert _last_heartbeat(cp) == clock.now()
