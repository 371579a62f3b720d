"""The agent's HTTP transport and backoff, against an ``httpx.MockTransport``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gpupool.agent.transport import AgentRejected, Backoff, HttpTransport, ServerUnavailable
from gpupool.schemas.agent import (
    DeviceInfo,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
)


def transport_answering(status: int, body: object = None) -> HttpTransport:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if status == 0:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(status, json=body)

    t = HttpTransport("http://server:1/", "secret", transport=httpx.MockTransport(handler))
    t.seen = seen  # type: ignore[attr-defined]
    return t


def test_heartbeat_posts_the_request_with_the_token_and_parses_the_answer() -> None:
    answer = HeartbeatResponse(epoch=3, heartbeat_interval_s=2.0)
    t = transport_answering(200, answer.model_dump(mode="json"))
    got = t.heartbeat(HeartbeatRequest(node="n1", epoch=2))
    assert got == answer
    (request,) = t.seen  # type: ignore[attr-defined]
    assert request.url.path == "/v1/agent/heartbeat"
    assert request.headers["Authorization"] == "Bearer secret"
    assert json.loads(request.content)["node"] == "n1"


@pytest.mark.parametrize("status", [0, 500, 503, 429])
def test_network_errors_and_5xx_mean_try_again(status: int) -> None:
    with pytest.raises(ServerUnavailable):
        transport_answering(status, {}).heartbeat(HeartbeatRequest(node="n1", epoch=0))


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_needs_a_person(status: int) -> None:
    with pytest.raises(AgentRejected, match="token-file"):
        transport_answering(status, {}).heartbeat(HeartbeatRequest(node="n1", epoch=0))


def test_an_answer_that_is_not_the_protocol_is_not_trusted() -> None:
    with pytest.raises(ServerUnavailable, match="unexpected answer"):
        transport_answering(200, {"epoch": "x"}).heartbeat(HeartbeatRequest(node="n", epoch=0))


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets() -> None:
    b = Backoff(base_s=0.5, cap_s=4.0, seed=1)
    delays = [b.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        ceiling = min(4.0, 0.5 * 2**n)
        assert ceiling / 2 <= d <= ceiling
    b.reset()
    assert b.next_delay() <= 0.5


def test_a_busy_servers_retry_after_is_kept_and_the_heartbeat_names_its_node() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503, headers={"Retry-After": "7"}, json={"detail": "busy"})

    t = HttpTransport("http://server:1/", "secret", transport=httpx.MockTransport(handler))
    with pytest.raises(ServerUnavailable) as caught:
        t.heartbeat(HeartbeatRequest(node="n1", epoch=2))
    assert caught.value.retry_after_s == 7.0
    assert seen[0].headers["X-Gpupool-Node"] == "n1"
    backoff = Backoff(seed=1)
    waits = [backoff.next_delay(caught.value.retry_after_s) for _ in range(20)]
    assert all(7.0 <= w <= 7.0 * 1.25 for w in waits)
    assert len(set(waits)) > 1  # jittered: agents told the same number do not come together
    assert Backoff(seed=1).next_delay(None) <= 0.5  # without a hint: the agent's own backoff


def _report(aid: str, state: str = "running") -> dict[str, object]:
    return {"assignment_id": aid, "state": state}


def test_heartbeats_go_as_deltas_after_an_acknowledged_full_state() -> None:
    from gpupool.schemas.agent import DeviceTelemetry, ReplicaStatus

    bodies: list[dict[str, object]] = []
    want_full = [False]

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        ask = want_full[0] and body.get("base") is not None
        answer = {"epoch": 1, "heartbeat_interval_s": 5.0, "ack_seq": body["seq"], "want_full": ask}
        return httpx.Response(200, json=answer)

    t = HttpTransport("http://server:1/", "secret", transport=httpx.MockTransport(handler))
    sample = [DeviceTelemetry(uuid="g0", temperature_c=50.0)]
    a = ReplicaStatus.model_validate(_report("a"))
    b = ReplicaStatus.model_validate(_report("b"))
    t.heartbeat(HeartbeatRequest(node="n1", epoch=1, replicas=[a, b], telemetry=sample))
    assert (bodies[0]["seq"], "base" in bodies[0], len(bodies[0]["replicas"])) == (1, False, 2)
    b2 = ReplicaStatus.model_validate(_report("b", "exited"))
    t.heartbeat(HeartbeatRequest(node="n1", epoch=1, replicas=[a, b2], telemetry=sample))
    assert bodies[1]["base"] == 1
    assert [r["assignment_id"] for r in bodies[1]["replicas"]] == ["b"]  # only what changed
    assert bodies[1]["telemetry"] == []  # sampled: nothing moved since the last sample
    hot = [DeviceTelemetry(uuid="g0", temperature_c=80.0)]
    want_full[0] = True  # the server lost track: it asks, the full state follows at once
    answer = t.heartbeat(HeartbeatRequest(node="n1", epoch=1, replicas=[a, b2], telemetry=hot))
    assert answer.want_full is False
    assert bodies[2]["base"] == 2
    assert bodies[2]["telemetry"] != []  # the temperature moved: sent at once
    assert "base" not in bodies[3]
    assert len(bodies[3]["replicas"]) == 2


def test_an_older_server_that_refuses_the_delta_fields_gets_plain_full_states() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "seq" in body:
            return httpx.Response(422, json={"detail": "seq: extra fields not permitted"})
        return httpx.Response(200, json={"epoch": 1, "heartbeat_interval_s": 5.0})

    t = HttpTransport("http://server:1/", "secret", transport=httpx.MockTransport(handler))
    for _ in range(2):
        assert t.heartbeat(HeartbeatRequest(node="n1", epoch=1)).epoch == 1
    assert ["seq" in b for b in bodies] == [True, False, False]


def test_an_older_server_refusing_the_context_reserve_gets_the_registration_without_it() -> None:
    bodies: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if any("context_reserve_mib" in d for d in body["devices"]):
            return httpx.Response(422, json={"detail": "context_reserve_mib: extra fields"})
        answer = {"node_id": "n1", "epoch": 1, "heartbeat_interval_s": 5.0}
        return httpx.Response(200, json={**answer, "server_version": "0.1"})

    t = HttpTransport("http://server:1/", "secret", transport=httpx.MockTransport(handler))
    gpu = DeviceInfo(uuid="g0", index=0, model="A100", memory_mib=81920, context_reserve_mib=768)
    request = RegisterRequest(
        node="n1", cpu_milli=1000, memory_mib=1024, devices=[gpu], agent_version="x"
    )
    assert t.register(request).epoch == 1
    assert [d["context_reserve_mib"] for d in bodies[0]["devices"]] == [768]
    assert ["context_reserve_mib" in d for d in bodies[1]["devices"]] == [False]
    # A device whose reserve is unknown goes without the field: an older server takes it at once.
    bodies.clear()
    unknown = request.model_copy(
        update={"devices": [gpu.model_copy(update={"context_reserve_mib": None})]}
    )
    assert t.register(unknown).epoch == 1
    assert len(bodies) == 1
