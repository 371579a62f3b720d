"""The API's liveness watch (``api/shedding.py``: ``watch``) sleeps while the server is idle
(issue 26: the idle pool under 0.1 CPU-s a minute): it used to wake once a second to find
nothing to write. News (a node heard) wakes it at once, and a fleet's heard nodes are still
written in one batch a second at most."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from sqlalchemy import select

from gpupool.api.shedding import watch
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.services.auth import authenticate
from gpupool.control.services.liveness import Liveness
from gpupool.store.models import NodeModel
from tests.control.builders import register


def _heard_at(cp: ControlPlane) -> dict[str, float]:
    with cp.read() as s:
        return {n.name: n.last_heartbeat for n in s.scalars(select(NodeModel))}


async def _until(test: Callable[[], bool], what: str) -> None:
    for _ in range(600):  # 30 s: generous on a loaded machine
        if test():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_idle_watch_sleeps_and_news_of_heard_nodes_wakes_it_to_write_them_in_batches(
    cp: ControlPlane, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [f"n{i}" for i in range(6)]
    for name in nodes:
        register(cp, name)
    looks: list[str] = []
    flushes: list[tuple[int, int, int]] = []
    for name in ("pending", "due_in"):
        real = getattr(Liveness, name, None)
        if real is None:
            continue

        def counted(self: Liveness, _real=real, _name=name) -> object:  # type: ignore[no-untyped-def]
            looks.append(_name)
            return _real(self)

        monkeypatch.setattr(Liveness, name, counted)
    real_flush = Liveness.flush

    def counted_flush(self: Liveness) -> tuple[int, int, int]:
        flushes.append(real_flush(self))
        return flushes[-1]

    monkeypatch.setattr(Liveness, "flush", counted_flush)

    # As gpupool up keeps tokens (5 minutes): the watch need not look for tokens to renew.
    cp.principals.ttl_s = 300.0

    async def main() -> int:
        task = asyncio.create_task(watch(cp))
        try:
            await asyncio.sleep(3.0)  # idle: three of the old once-a-second looks
            idle_looks = len(looks)
            clock.advance(60.0)
            first = cp.now()
            cp.admission.heard("n0", first)
            await _until(lambda: _heard_at(cp)["n0"] == first, "n0 written")
            clock.advance(1.0)
            later = cp.now()
            for name in nodes[1:]:  # a fleet: one after the other, within the second
                cp.admission.heard(name, later)
                await asyncio.sleep(0)
            await _until(
                lambda: all(_heard_at(cp)[n] == later for n in nodes[1:]), "the others written"
            )
            return idle_looks
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    idle_looks = asyncio.run(main())
    assert idle_looks <= 1  # one look at the start, then asleep
    assert [heard for heard, _, _ in flushes] == [1, 5]  # the five in one batch


def test_a_token_in_use_on_an_idle_server_is_renewed_though_the_watch_sleeps(
    cp: ControlPlane,
) -> None:
    # No node heard, no news: the watch sleeps, but no longer than half the cache's lifetime,
    # so a token in use is checked again and renewed before its entry runs out
    # (auth.revalidate), and its calls keep the short way.
    cp.principals.ttl_s = 10.0
    secret = cp.settings.admin_token_path.read_text().strip()

    async def main() -> list[float]:
        task = asyncio.create_task(watch(cp))
        missed: list[float] = []
        try:
            await asyncio.sleep(0.5)  # the watch is asleep, nothing to do
            with cp.read() as s:  # then a call: its token cached, then used
                authenticate(s, secret, cp.now(), cp.principals)
            start = time.monotonic()
            while time.monotonic() - start < 15.0:  # past the entry's first lifetime
                if cp.principals.get(secret, cp.now()) is None:
                    missed.append(time.monotonic() - start)
                await asyncio.sleep(0.5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return missed

    assert asyncio.run(main()) == []  # never ran out


def test_the_watch_goes_on_after_an_unexpected_error_in_a_flush(
    cp: ControlPlane, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flush that fails in a way nobody foresaw must not end the watch: the server would
    # then write no shed or quiet heartbeat any more, and the leader would mark every node
    # it heard only so down.
    register(cp, "n1")
    real_flush = Liveness.flush
    failures: list[int] = []

    def failing_once(self: Liveness) -> tuple[int, int, int]:
        if not failures:
            failures.append(1)
            raise RuntimeError("something nobody foresaw")
        return real_flush(self)

    monkeypatch.setattr(Liveness, "flush", failing_once)

    async def main() -> None:
        task = asyncio.create_task(watch(cp))
        try:
            clock.advance(60.0)
            first = cp.now()
            cp.admission.heard("n1", first)
            await _until(lambda: bool(failures), "the failing flush")
            clock.advance(20.0)
            later = cp.now()
            cp.admission.heard("n1", later)
            await _until(lambda: _heard_at(cp)["n1"] == later, "n1 written after the failure")
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
