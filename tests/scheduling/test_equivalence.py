"""Fast paths give the same answers as the plain one-by-one definitions they replace.

Each test keeps a short reference implementation (the definition, written the slow and
obvious way) and checks the scheduler's faster code against it on random snapshots.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.jobs import Job
from gpupool.scheduling.admission import QuotaLedger, _memory_governed
from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.cyclestate import PoolState
from gpupool.scheduling.decision import Decision, PendingReason
from gpupool.scheduling.ordering import Fifo
from gpupool.scheduling.placement.base import CapacityArrays, Choice, Shape
from gpupool.scheduling.release import Release
from gpupool.scheduling.reservation import Timeline
from gpupool.scheduling.scheduler import _Cycle, schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder
from tests.scheduling.test_properties import SETTINGS, snapshots


def _reference_borrowers(snap: ClusterSnapshot) -> tuple[dict[tuple[str, str], int], set[str]]:
    """Use per (tenant, pool) and the borrowing jobs, counting every job in start order."""
    milli: dict[tuple[str, str], int] = {}
    mem: dict[tuple[str, str], int] = {}
    borrowing: set[str] = set()
    jobs = sorted(snap.running_by_job.items(), key=lambda kv: (kv[1][0].start_time, kv[0]))
    for job_id, replicas in jobs:
        key = (replicas[0].tenant, replicas[0].pool)
        milli[key] = milli.get(key, 0) + sum(r.gpu_milli for r in replicas)
        mem[key] = mem.get(key, 0) + sum(r.gpu_memory_mib for r in replicas)
        explicit = next((r.borrowing for r in replicas if r.borrowing is not None), None)
        quota = snap.quota(*key)
        if explicit is not None:
            flag = explicit
        elif quota is None:
            flag = False
        else:
            flag = milli[key] > quota.guaranteed_milli or (
                _memory_governed(quota) and mem[key] > quota.guaranteed_memory_mib
            )
        if flag:
            borrowing.add(job_id)
    return milli, borrowing


@SETTINGS
@given(snapshots(), st.data())
def test_the_ledger_counts_use_and_borrowers_as_in_start_order(snap: ClusterSnapshot, data):  # type: ignore[no-untyped-def]
    # Some replicas carry an explicit borrowing flag, the others leave it to the ledger.
    flags = [data.draw(st.sampled_from([None, None, True, False])) for _ in snap.running]
    running = tuple(replace(r, borrowing=f) for r, f in zip(snap.running, flags, strict=True))
    snap = replace(snap, running=running)
    ledger = QuotaLedger(snap)
    milli, borrowing = _reference_borrowers(snap)
    for job_id in snap.running_by_job:
        assert ledger.is_borrowing(job_id) == (job_id in borrowing), job_id
    for (tenant, pool), amount in milli.items():
        assert ledger.use(tenant, pool)[0] == amount


def _released_one_by_one(live: CapacityArrays, releases: list[Release], k: int) -> CapacityArrays:
    work = live.copy()
    for rel in releases[:k]:
        work.release(rel.shape, rel.choice)
    return work


def _same(a: CapacityArrays, b: CapacityArrays) -> bool:
    return (
        np.array_equal(a.free_milli, b.free_milli)
        and np.array_equal(a.free_mem, b.free_mem)
        and np.array_equal(a.cpu_free, b.cpu_free)
        and np.array_equal(a.host_mem_free, b.host_mem_free)
    )


@SETTINGS
@given(snapshots(fill=True), st.sampled_from([250, 500, 1000]), st.integers(1, 4))
def test_the_timeline_matches_releasing_one_by_one(snap: ClusterSnapshot, milli: int, count: int):
    cap = build_capacity(snap)
    live = cap.view("default")
    releases = []
    for r in snap.running:
        held = cap.held_by(r)
        if held is not None:
            releases.append(Release(r.expected_end, held[0], held[1]))
    # A proportional-memory release too (a job this cycle started), resolved per slot.
    if live.usable.any():
        node, slot = (int(x) for x in np.argwhere(live.usable)[0])
        releases.append(Release(snap.now + 60, Shape(100, 1, None, 0, 0), Choice(node, (slot,))))
    timeline = Timeline(live, releases, snap.now)
    ordered = timeline.releases
    shape = Shape(1000 if count > 1 else milli, count)

    def fits(arrays: CapacityArrays) -> bool:
        return bool(arrays.feasible_nodes(shape).any())

    found = timeline.earliest(fits)
    # The definition: the first prefix of releases after which it fits, plus every release
    # ending at that same moment.
    expected = None
    for k in range(len(ordered) + 1):
        work = _released_one_by_one(live, ordered, k)
        if fits(work):
            if k == 0:
                expected = (snap.now, work)
                break
            last = ordered[k - 1]
            j = k
            while j < len(ordered) and last.time is not None and ordered[j].time == last.time:
                j += 1
            when = None if last.time is None else max(last.time, snap.now)
            expected = (when, _released_one_by_one(live, ordered, j))
            break
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found[0] == expected[0]
    assert _same(found[1], expected[1])


def _plain_sweep(
    self: _Cycle, sealed: PoolState, rest: tuple[Job, ...], ids: tuple[str, ...]
) -> None:
    """The definition: every job after the sealing one goes through ``consider`` in order."""
    for job in rest:
        if job.id not in self.running_ids:
            self.consider(job)


def _everything(d: Decision) -> tuple[object, ...]:
    return (
        d.starts,
        d.preemptions,
        d.reservations,
        list(d.pending.items()),  # the order of the answers too
        d.order,
        [(k, d.priorities[k]) for k in d.priorities],
    )


@st.composite
def blocked_queues(draw: st.DrawFn) -> ClusterSnapshot:
    """Busy nodes and a queue behind them: jobs block and pools seal. Some queued jobs are
    held, some wait out a delay, one may be a stale entry of a running job; two pools or one."""
    now = 10_000.0
    b = SnapshotBuilder(now=now)
    pools = ["default", "p2"] if draw(st.booleans()) else ["default"]
    for p in pools:
        b.pool(p)
    running: list[str] = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, 4))
        b.node(f"n{i}", gpus=gpus, pool=draw(st.sampled_from(pools)))
        for g in range(gpus):
            if draw(st.integers(0, 5)) > 0:  # most devices busy
                running.append(f"r{i}-{g}")
                end = draw(st.sampled_from([None, now + 500, now + 2000]))
                b.run(running[-1], node=f"n{i}", devices=[g], expected_end=end)
    # One kind of exception per queue at most (none: the sweep answers it in one step).
    odd = draw(st.sampled_from(["none", "held", "later", "stale", "all"]))
    for j in range(draw(st.integers(2, 30))):
        b.job(
            f"j{j:02d}",
            gpus=draw(st.sampled_from([0.25, 1, 2, 9])),
            pool=draw(st.sampled_from([*pools, "default", "default"])),
            priority=draw(st.sampled_from([100, 500, 900])),
            submit=float(draw(st.integers(0, 50))),
            eligible=now + 60 if odd in ("later", "all") and draw(st.integers(0, 3)) == 0 else None,
            expected=draw(st.sampled_from([None, 300.0, 9000.0])),
            held=odd in ("held", "all") and draw(st.integers(0, 5)) == 0,
        )
    snap = b.build()
    if running and odd in ("stale", "all"):
        stale = replace(snap.pending[0], id=draw(st.sampled_from(running)))
        snap = replace(snap, pending=(*snap.pending, stale))
    return snap


@settings(SETTINGS, max_examples=300)
@given(blocked_queues(), st.sampled_from(["fifo", "multifactor"]), st.sampled_from([None, 3, 8]))
def test_a_sealed_queue_is_answered_as_if_each_job_were_considered(
    snap: ClusterSnapshot, ordering: str, limit: int | None
) -> None:
    config = SchedulerConfig(
        backfill="strict", admission="none", ordering=ordering, max_jobs_per_cycle=limit
    )
    fast = schedule(snap, config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Cycle, "sweep", _plain_sweep)
        plain = schedule(snap, config)
    assert _everything(fast) == _everything(plain)


def test_a_long_strict_queue_is_not_considered_job_by_job(monkeypatch: pytest.MonkeyPatch) -> None:
    b = SnapshotBuilder(now=10_000.0)
    b.pool("default")
    b.node("n0", gpus=1)
    b.run("busy", node="n0", expected_end=12_000.0)
    for i in range(200):
        b.job(f"w{i:03d}", gpus=1, submit=float(i))
    snap = b.build()
    calls: list[str] = []
    consider = _Cycle.consider

    def counting(self: _Cycle, job: Job) -> None:
        calls.append(job.id)
        consider(self, job)

    monkeypatch.setattr(_Cycle, "consider", counting)
    d = schedule(snap, SchedulerConfig(backfill="strict", admission="none", ordering="fifo"))
    # The first job is blocked (and reserved), the second finds the gate closed and seals the
    # pool: the other 198 are answered together.
    assert calls == ["w000", "w001"]
    assert len(d.pending) == 200
    assert d.pending["w000"].estimated_start == 12_000.0
    shared = d.pending["w001"]
    assert shared.reason is PendingReason.PRIORITY
    assert "w000" in shared.message
    assert all(d.pending[f"w{i:03d}"] is shared for i in range(1, 200))
    assert list(d.pending) == [f"w{i:03d}" for i in range(200)]


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 5.0, 5.5, 9.0]), st.sampled_from([0.0, 1.0, 2.0])),
        min_size=0,
        max_size=25,
    ),
    st.randoms(use_true_random=False),
)
def test_fifo_orders_by_eligible_then_submit_time_then_id(
    times: list[tuple[float, float]], rng: random.Random
) -> None:
    b = SnapshotBuilder(now=100.0)
    b.pool("default")
    b.node("n0", gpus=1)
    names = [f"j{i:02d}" for i in range(len(times))]
    rng.shuffle(names)  # ids not in queue order
    for name, (eligible, submit) in zip(names, times, strict=True):
        b.job(name, submit=submit, eligible=eligible)
    snap = b.build()
    ordering = Fifo().rank(snap, SchedulerConfig(ordering="fifo"), build_capacity(snap))
    expected = sorted(snap.pending, key=lambda j: (j.eligible_time, j.submit_time, j.id))
    assert list(ordering.jobs) == expected
    assert ordering.ids == tuple(j.id for j in expected)
