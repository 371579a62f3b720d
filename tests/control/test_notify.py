"""Notices between server processes (``store/notify.py``) on a real PostgreSQL: orders one
control plane commits wake the long polls another holds, once, on commit only; a standby's
wake-up reaches the leader's loop. (Two real servers and an agent: tests/fleet/test_replicas.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.orders import mark
from gpupool.control.settings import ServerSettings
from gpupool.store.notify import MAX_PAYLOAD, parse, payloads

#: How long a test waits for a notice at most (a loaded machine); a wake takes milliseconds.
PATIENCE_S = 30.0


@pytest.fixture
def planes(tmp_path: Path, pg_database: str) -> Iterator[tuple[ControlPlane, ControlPlane]]:
    made = [
        ControlPlane(ServerSettings(home=tmp_path / n, database_url=pg_database, schedule=False))
        for n in ("a", "b")
    ]
    try:
        for plane in made:
            listener = plane.start_listening()
            assert listener is not None
            assert listener.listening.wait(PATIENCE_S)
        yield made[0], made[1]
    finally:
        for plane in made:
            plane.close()


def test_long_payloads_are_split_below_postgresqls_limit() -> None:
    names = [f"node-{i:05d}" for i in range(3000)]
    sent = payloads("origin-1", names)
    assert len(sent) > 1
    assert all(len(p.encode()) <= MAX_PAYLOAD for p in sent)
    heard = [parse(p) for p in sent]
    assert all(h is not None and h[0] == "origin-1" for h in heard)
    assert sorted(n for h in heard if h is not None for n in h[1]) == names
    assert parse("not json") is None
    assert parse('{"a": 1}') is None


def test_orders_committed_in_one_process_wake_a_poll_held_in_another(
    planes: tuple[ControlPlane, ControlPlane],
) -> None:
    a, b = planes

    async def poll_then_commit() -> int:
        since = b.orders.seq("n1")
        waiting = asyncio.create_task(b.orders.wait("n1", since, PATIENCE_S))
        await asyncio.sleep(0.2)  # the poll is waiting
        with a.tx() as s:
            mark(s, ["n1", "n2"])
        return await waiting

    seq = asyncio.run(poll_then_commit())
    assert seq > 0, "the poll timed out: the notice did not reach the other process"
    assert b.orders.seq("n2") == 1
    assert a.orders.seq("n1") == 1, "a process announced its own notice a second time"


def _order_then_fail(plane: ControlPlane, node: str) -> None:
    with plane.tx() as s:
        mark(s, [node])
        raise RuntimeError("rolled back")


def test_a_rolled_back_transaction_sends_nothing(
    planes: tuple[ControlPlane, ControlPlane],
) -> None:
    a, b = planes
    with pytest.raises(RuntimeError):
        _order_then_fail(a, "gone")
    with a.tx() as s:  # a later notice on the same channel arrives; the rolled-back one never
        mark(s, ["later"])

    async def until_later() -> None:
        while b.orders.seq("later") == 0:
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(until_later(), PATIENCE_S))
    assert b.orders.seq("gone") == 0


def test_a_standby_wakes_the_leaders_loop_and_no_one_else(
    planes: tuple[ControlPlane, ControlPlane],
) -> None:
    a, b = planes
    b.epoch = 0  # b does not lead: it ignores wake-ups
    a.epoch = 7  # a leads
    a.wakeup.clear()
    b.wakeup.clear()
    b.wake_leader()
    assert a.wakeup.wait(PATIENCE_S)
    a.wakeup.clear()
    a.wake_leader()  # b, which does not lead, hears it and stays asleep
    with a.tx() as s:  # a later notice proves the earlier ones were handled
        mark(s, ["probe"])

    async def until_probe() -> None:
        while b.orders.seq("probe") == 0:
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(until_probe(), PATIENCE_S))
    assert not b.wakeup.is_set()
