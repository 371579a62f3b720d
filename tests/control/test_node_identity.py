"""Node identity in the store (issue 17 item 4): one live agent per node name, devices that are
no longer reported leave, and a down node without assignments can be deleted."""

from __future__ import annotations

import pytest

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.heartbeat import HeartbeatService
from gpupool.control.services.nodes import NodeService
from gpupool.schemas.agent import DeviceInfo, HeartbeatRequest, HeartbeatResponse, RegisterRequest
from tests.control.builders import ADMIN, AGENT, heartbeat, register, running, submit

A = "a" * 32
B = "b" * 32


def _register(cp: ControlPlane, agent_id: str | None, gpus: int = 2) -> None:
    NodeService(cp).register(
        AGENT,
        RegisterRequest(
            node="n1",
            address="10.0.0.1",
            cpu_milli=8000,
            memory_mib=65536,
            agent_version="test",
            agent_id=agent_id,
            devices=[
                DeviceInfo(uuid=f"n1-gpu{i}", index=i, model="A100", memory_mib=81920)
                for i in range(gpus)
            ],
        ),
    )


def _uuids(cp: ControlPlane) -> list[str]:
    return [d.uuid for d in NodeService(cp).get(ADMIN.principal, "n1").devices]


def test_a_second_agent_is_refused_while_the_first_lives_and_welcome_once_it_is_gone(
    cp: ControlPlane, clock: ManualClock
) -> None:
    _register(cp, A)
    _register(cp, A)  # the same agent, restarted
    with pytest.raises(Conflict, match="already served by a live agent") as refused:
        _register(cp, B, gpus=4)
    assert "--node" in str(refused.value)
    assert _uuids(cp) == ["n1-gpu0", "n1-gpu1"]  # nothing merged
    clock.advance(cp.settings.node_timeout_s + 1)  # the first agent fell silent
    _register(cp, B, gpus=4)
    assert len(_uuids(cp)) == 4


def test_an_agent_that_sends_no_id_is_not_checked(cp: ControlPlane) -> None:
    _register(cp, A)
    _register(cp, None)
    assert len(_uuids(cp)) == 2


def test_a_device_held_by_a_live_slice_stays_unhealthy_until_it_is_free(cp: ControlPlane) -> None:
    _register(cp, A, gpus=1)
    job = submit(cp, gpus="1")
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    try:
        loop.cycle()
        aid = heartbeat(cp, "n1").start[0].assignment_id
        heartbeat(cp, "n1", replicas=[running(aid)])
        _register(cp, A, gpus=0)  # the GPU vanished while the job held it
        [dev] = NodeService(cp).get(ADMIN.principal, "n1").devices
        assert dev.health.value == "unhealthy"
        assert job.id
    finally:
        loop.leadership.release()


def test_deleting_an_up_node_is_refused_with_what_to_do(cp: ControlPlane) -> None:
    register(cp, "n1")
    with pytest.raises(Conflict, match=r"only a down node can be deleted.*gpupool drain n1"):
        NodeService(cp).delete(ADMIN, "n1")


def test_an_agent_back_after_another_took_its_name_kills_its_copies_then_must_register(
    cp: ControlPlane, clock: ManualClock
) -> None:
    _register(cp, A, gpus=1)
    job = submit(cp, gpus="1", requeue="on-preemption")
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    try:
        loop.cycle()
        aid = heartbeat(cp, "n1").start[0].assignment_id
        heartbeat(cp, "n1", replicas=[running(aid)])
        clock.advance(cp.settings.node_timeout_s + 1)  # agent A is cut off
        assert loop.nodes.mark_silent_nodes_down(watching_since=0.0) == ["n1"]
        _register(cp, B, gpus=1)  # agent B takes the name

        def beat_from_a(*replicas: str) -> HeartbeatResponse:
            return HeartbeatService(cp).heartbeat(
                AGENT,
                HeartbeatRequest(
                    node="n1", epoch=cp.epoch, agent_id=A, replicas=[running(r) for r in replicas]
                ),
            )

        back = beat_from_a(aid)  # A returns, its copy still running
        assert [(o.assignment_id, o.signal) for o in back.stop] == [(aid, "SIGKILL")]
        assert back.start == []
        done = beat_from_a()  # nothing left running: it must register, and is refused
        assert done.registered is False
        with pytest.raises(Conflict, match="already served by a live agent"):
            _register(cp, A, gpus=1)
        assert job.id
    finally:
        loop.leadership.release()
