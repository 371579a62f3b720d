"""The order board behind the agents' long poll: a commit that starts or stops something on a
node bumps that node's sequence after the commit and wakes its waiters, from any thread."""

from __future__ import annotations

import asyncio
import threading

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.machinery.orders import OrderBoard
from gpupool.control.services.jobs import JobService
from tests.control.builders import ADMIN, register, submit


def test_a_waiter_is_woken_by_an_announcement_from_another_thread() -> None:
    board = OrderBoard()

    async def scenario() -> tuple[int, int]:
        waiting = asyncio.create_task(board.wait("n1", 0, timeout_s=30))
        await asyncio.sleep(0.05)
        threading.Thread(target=board.announce, args=(["n1", "n2"],)).start()
        return await waiting, board.seq("n2")

    assert asyncio.run(scenario()) == (1, 1)


def test_a_wait_answers_at_once_when_the_sequence_is_already_past() -> None:
    board = OrderBoard()
    board.announce(["n1"])
    assert asyncio.run(board.wait("n1", 0, timeout_s=30)) == 1
    assert asyncio.run(board.wait("n1", 1, timeout_s=0)) == 1  # nothing new: times out
    assert asyncio.run(board.wait("n9", -1, timeout_s=30)) == 0


def test_a_stopping_server_answers_waiting_and_later_polls_at_once() -> None:
    board = OrderBoard()

    async def scenario() -> tuple[int, int]:
        waiting = asyncio.create_task(board.wait("n1", 0, timeout_s=30))
        await asyncio.sleep(0.05)
        board.release_all()
        first = await asyncio.wait_for(waiting, timeout=5)
        later = await asyncio.wait_for(board.wait("n1", 0, timeout_s=30), timeout=5)
        return first, later

    assert asyncio.run(scenario()) == (0, 0)  # nothing new: the agent simply polls again


def test_starts_and_stops_committed_for_a_node_bump_its_sequence(cp: ControlPlane) -> None:
    register(cp, "n1", gpus=1)
    register(cp, "n2", gpus=1)
    job = submit(cp, "j", gpus="1")
    assert cp.orders.seq("n1") + cp.orders.seq("n2") == 0
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == (job.id,)
    placed = "n1" if cp.orders.seq("n1") else "n2"
    other = "n2" if placed == "n1" else "n1"
    assert (cp.orders.seq(placed), cp.orders.seq(other)) == (1, 0)
    JobService(cp).cancel(ADMIN, job.id)
    assert (cp.orders.seq(placed), cp.orders.seq(other)) == (2, 0)


def test_the_api_long_poll_answers_with_the_nodes_sequence(cp: ControlPlane) -> None:
    from tests.api.helpers import make_api

    api = make_api(cp)
    agent = api.tokens["agent"]
    assert api.call(agent, "GET", "/v1/agent/nodes/n1/orders").json() == {
        "seq": 0,
        "changed": True,
    }
    idle = api.call(agent, "GET", "/v1/agent/nodes/n1/orders?since=0&timeout=0").json()
    assert idle == {"seq": 0, "changed": False}
    cp.orders.announce(["n1"])
    woken = api.call(agent, "GET", "/v1/agent/nodes/n1/orders?since=0&timeout=30").json()
    assert woken == {"seq": 1, "changed": True}
