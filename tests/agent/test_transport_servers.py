"""An agent given several server replicas (``--server`` repeated): it moves to the next one
when the one in use gives no useful answer, and a long poll on another replica starts from
that replica's own numbers. Against an ``httpx.MockTransport`` (the real servers:
tests/fleet/test_replicas.py)."""

from __future__ import annotations

import httpx
import pytest

from gpupool.agent.transport import HttpTransport, ServerUnavailable, server_urls
from gpupool.domain.errors import GpupoolError
from gpupool.schemas.agent import HeartbeatRequest, HeartbeatResponse

ANSWER = HeartbeatResponse(epoch=1, heartbeat_interval_s=5.0).model_dump(mode="json")


def test_server_urls_are_split_on_commas_deduplicated_and_checked() -> None:
    got = server_urls(["http://a:1/", "http://b:2,http://a:1", " https://c "])
    assert got == ["http://a:1", "http://b:2", "https://c"]
    with pytest.raises(GpupoolError, match="not a server URL"):
        server_urls(["a:1"])
    with pytest.raises(GpupoolError, match="no server URL"):
        server_urls([" , "])


def _replicas(down: set[str], orders_seq: dict[str, int]) -> tuple[HttpTransport, list[str]]:
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        hosts.append(host)
        if host in down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path.endswith("/orders"):
            since = int(request.url.params["since"])
            seq = orders_seq[host]
            return httpx.Response(200, json={"seq": seq, "changed": seq > since})
        return httpx.Response(200, json=ANSWER)

    urls = ["http://a:1", "http://b:1"]
    t = HttpTransport(urls, "secret", transport=httpx.MockTransport(handler))
    return t, hosts


def test_a_replica_that_does_not_answer_sends_the_next_try_to_the_other() -> None:
    down: set[str] = set()
    t, hosts = _replicas(down, {"a": 0, "b": 0})
    first = t.servers.current.removeprefix("http://").split(":")[0]
    other = "b" if first == "a" else "a"
    t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    down.add(first)
    with pytest.raises(ServerUnavailable):
        t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    t.heartbeat(HeartbeatRequest(node="n1", epoch=0))  # the retry: the other replica
    assert hosts == [first, first, other]
    down.clear()
    down.add(other)  # and back again when that one goes
    with pytest.raises(ServerUnavailable):
        t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    assert hosts[-2:] == [other, first]


def test_a_busy_replicas_retry_after_keeps_the_agent_and_a_bare_5xx_moves_it() -> None:
    calls: list[str] = []
    answers = [
        httpx.Response(503, headers={"Retry-After": "2"}),  # shed: alive, come back later
        httpx.Response(500),  # broken: try the other
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return answers.pop(0) if answers else httpx.Response(200, json=ANSWER)

    t = HttpTransport(["http://a:1", "http://b:1"], "s", transport=httpx.MockTransport(handler))
    with pytest.raises(ServerUnavailable) as err:
        t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    assert err.value.retry_after_s == 2.0
    with pytest.raises(ServerUnavailable):
        t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    t.heartbeat(HeartbeatRequest(node="n1", epoch=0))
    assert calls[0] == calls[1]
    assert calls[2] != calls[1]


def test_a_long_poll_on_another_replica_starts_from_its_numbers_and_counts_as_changed() -> None:
    down: set[str] = set()
    seqs = {"a": 7, "b": 2}
    t, hosts = _replicas(down, seqs)
    first = t.servers.current.removeprefix("http://").split(":")[0]
    got = t.wait_for_orders("n1", -1, 1.0)
    assert got.seq == seqs[first]
    assert not t.wait_for_orders("n1", got.seq, 1.0).changed
    down.add(first)
    with pytest.raises(ServerUnavailable):
        t.wait_for_orders("n1", got.seq, 1.0)
    moved = t.wait_for_orders("n1", got.seq, 1.0)  # another replica: its own sequence
    other = "b" if first == "a" else "a"
    assert moved.seq == seqs[other]
    assert moved.changed  # the agent heartbeats once there
    assert hosts[-1] == other
