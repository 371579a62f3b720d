"""The scheduler memo: the caller's, reused across its cycles, rebuilt on any change, never
changes answers, and never shared with another caller."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given

from gpupool.domain.nodes import DeviceHealth
from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.scheduling.layout import build_layout
from gpupool.scheduling.memo import LAYOUT_MEMO_SIZE, SchedulerMemo
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder
from tests.scheduling.test_properties import SETTINGS, configs, snapshots


def _cluster() -> SnapshotBuilder:
    return SnapshotBuilder().node("a", gpus=2).node("b", gpus=4)


def test_the_same_tuples_give_the_same_layout_object() -> None:
    memo = SchedulerMemo()
    snap = _cluster().build()
    first = memo.layout_for(snap)
    assert memo.layout_for(snap) is first
    assert len(memo.layouts) == 1


def test_equal_but_freshly_built_tuples_hit_the_memo() -> None:
    memo = SchedulerMemo()
    one, two = _cluster().build(), _cluster().build()
    assert one.devices is not two.devices
    assert memo.layout_for(one) is memo.layout_for(two)


def test_a_device_turning_unhealthy_gives_a_new_layout() -> None:
    memo = SchedulerMemo()
    snap = _cluster().build()
    before = memo.layout_for(snap).layout
    sick = tuple(
        dataclasses.replace(d, health=DeviceHealth.UNHEALTHY) if d.uuid == "b-gpu0" else d
        for d in snap.devices
    )
    after = memo.layout_for(dataclasses.replace(snap, devices=sick)).layout
    assert after is not before
    row, slot = after.uuid_slot["b-gpu0"]
    assert before.usable[row, slot]
    assert not after.usable[row, slot]


def test_the_memo_keeps_only_the_most_recently_used_layouts() -> None:
    memo = SchedulerMemo()
    first = SnapshotBuilder().node("n0", gpus=1).build()
    kept = memo.layout_for(first)
    for i in range(1, LAYOUT_MEMO_SIZE + 3):
        memo.layout_for(SnapshotBuilder().node(f"n{i}", gpus=1).build())
        assert memo.layout_for(first) is kept  # used again: never the least recent
    assert len(memo.layouts) == LAYOUT_MEMO_SIZE
    memo.clear()
    assert memo.layouts == ()


def test_layout_arrays_are_read_only() -> None:
    layout = SchedulerMemo().layout_for(_cluster().build()).layout
    with pytest.raises(ValueError, match="read-only"):
        layout.usable[0, 0] = False
    with pytest.raises(ValueError, match="read-only"):
        layout.free_milli[0, 0] = 0


def test_a_cycle_does_not_change_the_remembered_free_arrays() -> None:
    memo = SchedulerMemo()
    snap = _cluster().run("r", node="b", devices=[0, 1], milli=1000).job("j", gpus=2).build()
    layout = memo.layout_for(snap).layout
    pristine = layout.free_milli.copy()
    decision = schedule(snap, SchedulerConfig(), memo)
    assert decision.starts  # it placed something, so the cycle's arrays did change
    assert np.array_equal(layout.free_milli, pristine)
    cap = build_capacity(snap, memo)
    row = cap.node_row["b"]
    assert cap.arrays.free_milli[row].tolist() == [0, 0, 1000, 1000]


def test_running_replicas_are_subtracted_afresh_each_cycle() -> None:
    memo = SchedulerMemo()
    busy = _cluster().run("r", node="a", devices=[0], milli=400).build()
    idle = _cluster().build()
    assert build_capacity(busy, memo).arrays.free_milli.sum() == 6000 - 400
    assert build_capacity(idle, memo).arrays.free_milli.sum() == 6000


def test_the_slots_memo_follows_the_replica_object_not_the_job() -> None:
    memo = SchedulerMemo()
    first = _cluster().run("r", node="b", devices=[0]).build()
    moved = _cluster().run("r", node="b", devices=[3]).build()
    assert first.running[0].job_id == moved.running[0].job_id
    cap_first, cap_moved = build_capacity(first, memo), build_capacity(moved, memo)
    row = cap_first.node_row["b"]
    assert cap_first.arrays.free_milli[row].tolist() == [0, 1000, 1000, 1000]
    assert cap_moved.arrays.free_milli[row].tolist() == [1000, 1000, 1000, 0]


def test_replicas_that_stopped_running_leave_the_memo() -> None:
    builder = _cluster()
    for i in range(3):
        builder.run(f"r{i}", node="b", devices=[i], milli=100)
    snap = builder.build()
    memo = SchedulerMemo(slack=0)
    build_capacity(snap, memo)
    found = memo.layout_for(snap)
    assert len(found.held) == 3
    idle = ClusterSnapshot(now=snap.now, nodes=snap.nodes, devices=snap.devices, pools=snap.pools)
    build_capacity(idle, memo)
    assert len(found.held) == 0


def test_requests_no_longer_queued_leave_the_memo() -> None:
    memo = SchedulerMemo(slack=0)
    waiting = _cluster().job("j1", gpus=1).job("j2", gpus=1).build()
    schedule(waiting, SchedulerConfig(), memo)
    found = memo.layout_for(waiting)
    assert {entry[0] for entry in found.shapes.values()} >= {
        j.spec.resources for j in waiting.pending
    }
    schedule(_cluster().build(), SchedulerConfig(), memo)
    assert len(found.shapes) == 0


def test_no_memo_means_a_fresh_one_for_that_call_only() -> None:
    snap = _cluster().run("r", node="b", devices=[0]).job("j", gpus=1).build()
    memo = SchedulerMemo()
    assert schedule(snap) == schedule(snap, SchedulerConfig(), memo)
    assert schedule(snap, SchedulerConfig(), None) == schedule(snap, SchedulerConfig(), memo)
    assert len(memo.layouts) == 1  # the calls without a memo left nothing in this one


def _five_clusters() -> list[ClusterSnapshot]:
    """Five clusters with running and waiting work, each a different layout."""
    snaps = []
    for i in range(LAYOUT_MEMO_SIZE + 1):
        b = SnapshotBuilder(now=100.0).node(f"c{i}-a", gpus=2).node(f"c{i}-b", gpus=4)
        b.run(f"c{i}-r", node=f"c{i}-b", devices=[0], milli=500, expected_end=400.0)
        for k in range(3):
            b.job(f"c{i}-j{k}", gpus=1 + k % 2, submit=float(k))
        snaps.append(b.build())
    return snaps


def test_callers_with_their_own_memos_keep_their_layouts_and_decide_as_each_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snaps = _five_clusters()
    config = SchedulerConfig()
    alone = [[schedule(s, config, SchedulerMemo()) for _ in range(3)] for s in snaps]
    built: list[int] = []
    real = build_layout

    def counting(*key):  # type: ignore[no-untyped-def]
        built.append(1)
        return real(*key)

    monkeypatch.setattr("gpupool.scheduling.memo.build_layout", counting)
    memos = [SchedulerMemo() for _ in snaps]
    together: list[list[Decision]] = [[] for _ in snaps]
    for _ in range(3):  # round robin: every caller's cycle between two of each other's
        for i, snap in enumerate(snaps):
            together[i].append(schedule(snap, config, memos[i]))
    assert together == alone
    # Five callers, one layout each, built once: none evicted another's (a cache shared by
    # all of them, four entries deep, rebuilt every layout on every cycle of this loop).
    assert len(built) == len(snaps)
    assert all(len(m.layouts) == 1 for m in memos)
    for memo, snap in zip(memos, snaps, strict=True):
        held = memo.layouts[0].held.values()
        assert [entry[0] for entry in held] == list(snap.running)


@SETTINGS
@given(snapshots(), configs())
def test_a_remembered_layout_gives_the_decision_of_a_fresh_one(snap, config):  # type: ignore[no-untyped-def]
    memo = SchedulerMemo()
    cold = schedule(snap, config, memo)
    assert schedule(snap, config, memo) == cold  # warm: layout and identity entries reused
    assert schedule(snap, config) == cold  # no memo at all
    fresh = build_layout(snap.nodes, snap.devices, snap.pools)
    assert fresh.node_names == memo.layout_for(snap).layout.node_names
    assert np.array_equal(fresh.usable, memo.layout_for(snap).layout.usable)
