"""The unit half of the link-cut test (``test_faults.py``): the agent's fence and how its
transport tells silence (counts toward the fence) from an answer or a refusal (does not).

These need no namespace: they run everywhere."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.fence import FENCE_AT, KILL_BY, Fence
from gpupool.agent.transport import HttpTransport, ServerSilent, ServerUnavailable
from gpupool.schemas.agent import HeartbeatRequest, HeartbeatResponse, ReplicaState
from tests.agent.helpers import wait_for
from tests.agent.test_agent import PY, FakeServer, assignment, make_agent


def test_the_fence_is_due_after_half_the_node_timeout_of_silence_and_once() -> None:
    fence = Fence(last_contact=100.0, node_timeout_s=30.0)
    assert not fence.due(100.0 + FENCE_AT * 30.0 - 0.01)
    assert fence.due(100.0 + FENCE_AT * 30.0)
    fence.fenced = True
    assert not fence.due(200.0), "fenced once per stretch of silence"
    fence.contact(300.0)
    assert not fence.fenced
    assert not fence.due(300.0 + FENCE_AT * 30.0 - 0.01)


def test_no_fence_without_a_node_timeout_from_the_server() -> None:
    fence = Fence(last_contact=0.0)  # an older server sends none
    assert not fence.due(1e9)


def test_the_fence_cuts_a_replicas_grace_so_the_kill_lands_before_the_node_timeout() -> None:
    fence = Fence(last_contact=0.0, node_timeout_s=40.0)
    now = FENCE_AT * 40.0
    assert fence.grace(now, 300.0) == pytest.approx(KILL_BY * 40.0 - now)
    assert fence.grace(now, 1.0) == 1.0
    assert fence.grace(KILL_BY * 40.0 + 5.0, 30.0) == 0.0  # checked late: kill at once
    assert "node timeout of 40s" in fence.reason(now)


def _heartbeat(transport: HttpTransport) -> None:
    transport.heartbeat(HeartbeatRequest(node="n1", epoch=1))


def test_a_timeout_is_silence() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    t = HttpTransport("http://server:1", "s", transport=httpx.MockTransport(handler))
    with pytest.raises(ServerSilent):
        _heartbeat(t)


def test_a_503_is_an_answer_not_silence() -> None:
    t = HttpTransport(
        "http://server:1", "s", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    with pytest.raises(ServerUnavailable) as caught:
        _heartbeat(t)
    assert not isinstance(caught.value, ServerSilent)


def test_a_refused_connection_is_not_silence() -> None:
    with socket.socket() as s:  # a port nothing listens on: the host answers with a reset
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = HttpTransport(f"http://127.0.0.1:{port}", "s", timeout_s=10)
    with pytest.raises(ServerUnavailable) as caught:
        _heartbeat(t)
    assert not isinstance(caught.value, ServerSilent), caught.value


class _Server(FakeServer):
    """The agent tests' fake server, telling the node timeout and going silent or erring."""

    def __init__(self, node_timeout_s: float) -> None:
        super().__init__()
        self.node_timeout_s = node_timeout_s
        self.failure: type[ServerUnavailable] | None = None

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        if self.failure is not None:
            raise self.failure("no answer")
        answer = super().heartbeat(request)
        return answer.model_copy(update={"node_timeout_s": self.node_timeout_s})


def _run_with_a_job(tmp: Path, failure: type[ServerUnavailable]) -> tuple[_Server, Agent, bool]:
    """Run an agent with one job, make the server fail with ``failure`` for a whole node
    timeout; whether the job was still running at the end."""
    server = _Server(node_timeout_s=2.0)
    agent = make_agent(tmp, server)
    stop = threading.Event()
    go = tmp / "go"
    code = f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    server.queue.append(
        HeartbeatResponse(
            epoch=1,
            heartbeat_interval_s=0.2,
            start=[assignment("a1", tmp, command=[PY, "-c", code])],
        )
    )
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: (r := server.last("a1")) is not None and r.state is ReplicaState.RUNNING)
        server.failure = failure
        failing_since = agent.clock.monotonic()
        # Either the fence stops the job, or a whole node timeout of failures passes.
        wait_for(
            lambda: (
                agent.executor.observe("a1").status != "running"
                or agent.clock.monotonic() - failing_since > server.node_timeout_s
            ),
            what="the fence or a node timeout",
        )
        running = agent.executor.observe("a1").status == "running"
        server.failure = None
        go.write_text("")
        wait_for(
            lambda: (r := server.last("a1")) is not None and r.state is ReplicaState.EXITED,
            what="the end reported after reconnecting",
        )
        return server, agent, running
    finally:
        stop.set()
        thread.join(timeout=10)


def test_an_agent_silent_for_half_the_node_timeout_stops_its_job_as_node_lost(
    tmp_path: Path,
) -> None:
    server, _, running = _run_with_a_job(tmp_path, ServerSilent)
    assert not running
    ended = server.last("a1")
    assert ended is not None
    assert ended.stop_reason is not None
    assert ended.stop_reason.value == "node", ended  # NODE_FAIL on the server, not a cancel


def test_an_agent_whose_server_answers_errors_keeps_its_job(tmp_path: Path) -> None:
    _, _, running = _run_with_a_job(tmp_path, ServerUnavailable)  # a 503, a refusal
    assert running
