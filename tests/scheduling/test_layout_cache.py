"""The capacity layout cache: reused across cycles, rebuilt on any change, never changes answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given

from gpupool.domain.nodes import DeviceHealth
from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.layout import (
    LAYOUT_CACHE_SIZE,
    build_layout,
    cached_layouts,
    clear_layout_cache,
    layout_for,
)
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder
from tests.scheduling.test_properties import SETTINGS, configs, snapshots


def _cluster() -> SnapshotBuilder:
    return SnapshotBuilder().node("a", gpus=2).node("b", gpus=4)


def test_the_same_tuples_give_the_same_layout_object():
    clear_layout_cache()
    snap = _cluster().build()
    first = layout_for(snap.nodes, snap.devices, snap.pools)
    assert layout_for(snap.nodes, snap.devices, snap.pools) is first
    assert cached_layouts() == 1


def test_equal_but_freshly_built_tuples_hit_the_cache():
    clear_layout_cache()
    one, two = _cluster().build(), _cluster().build()
    assert one.devices is not two.devices
    assert layout_for(*_key(one)) is layout_for(*_key(two))


def test_a_device_turning_unhealthy_gives_a_new_layout():
    clear_layout_cache()
    snap = _cluster().build()
    before = layout_for(*_key(snap))
    sick = tuple(
        dataclasses.replace(d, health=DeviceHealth.UNHEALTHY) if d.uuid == "b-gpu0" else d
        for d in snap.devices
    )
    after = layout_for(snap.nodes, sick, snap.pools)
    assert after is not before
    row, slot = after.uuid_slot["b-gpu0"]
    assert before.usable[row, slot]
    assert not after.usable[row, slot]


def test_the_cache_keeps_only_the_most_recent_layouts():
    clear_layout_cache()
    for i in range(LAYOUT_CACHE_SIZE + 3):
        snap = SnapshotBuilder().node(f"n{i}", gpus=1).build()
        layout_for(*_key(snap))
    assert cached_layouts() == LAYOUT_CACHE_SIZE


def test_layout_arrays_are_read_only():
    snap = _cluster().build()
    layout = layout_for(*_key(snap))
    with pytest.raises(ValueError, match="read-only"):
        layout.usable[0, 0] = False
    with pytest.raises(ValueError, match="read-only"):
        layout.free_milli[0, 0] = 0


def test_a_cycle_does_not_change_the_cached_free_arrays():
    clear_layout_cache()
    snap = _cluster().run("r", node="b", devices=[0, 1], milli=1000).job("j", gpus=2).build()
    layout = layout_for(*_key(snap))
    pristine = layout.free_milli.copy()
    decision = schedule(snap, SchedulerConfig())
    assert decision.starts  # it placed something, so the cycle's arrays did change
    assert np.array_equal(layout.free_milli, pristine)
    cap = build_capacity(snap)
    row = cap.node_row["b"]
    assert cap.arrays.free_milli[row].tolist() == [0, 0, 1000, 1000]


def test_running_replicas_are_subtracted_afresh_each_cycle():
    clear_layout_cache()
    busy = _cluster().run("r", node="a", devices=[0], milli=400).build()
    idle = _cluster().build()
    assert build_capacity(busy).arrays.free_milli.sum() == 6000 - 400
    assert build_capacity(idle).arrays.free_milli.sum() == 6000


def test_the_slots_memo_follows_the_replica_object_not_the_job():
    clear_layout_cache()
    first = _cluster().run("r", node="b", devices=[0]).build()
    moved = _cluster().run("r", node="b", devices=[3]).build()
    assert first.running[0].job_id == moved.running[0].job_id
    cap_first, cap_moved = build_capacity(first), build_capacity(moved)
    row = cap_first.node_row["b"]
    assert cap_first.arrays.free_milli[row].tolist() == [0, 1000, 1000, 1000]
    assert cap_moved.arrays.free_milli[row].tolist() == [1000, 1000, 1000, 0]


def test_replicas_that_stopped_running_leave_the_memo():
    clear_layout_cache()
    builder = _cluster()
    for i in range(3):
        builder.run(f"r{i}", node="b", devices=[i], milli=100)
    snap = builder.build()
    layout = layout_for(*_key(snap))
    build_capacity(snap)
    assert len(layout.held) == 3
    from gpupool.scheduling import capacity

    idle = ClusterSnapshot(now=snap.now, nodes=snap.nodes, devices=snap.devices, pools=snap.pools)
    old = capacity.HELD_MEMO_SLACK
    capacity.HELD_MEMO_SLACK = 0
    try:
        build_capacity(idle)
    finally:
        capacity.HELD_MEMO_SLACK = old
    assert len(layout.held) == 0


@SETTINGS
@given(snapshots(), configs())
def test_a_cached_layout_gives_the_decision_of_a_fresh_one(snap, config):  # type: ignore[no-untyped-def]
    clear_layout_cache()
    cold = schedule(snap, config)
    assert schedule(snap, config) == cold  # warm: layout and slots memo reused
    fresh = build_layout(*_key(snap))
    assert fresh.node_names == layout_for(*_key(snap)).node_names
    assert np.array_equal(fresh.usable, layout_for(*_key(snap)).usable)


def _key(snap: ClusterSnapshot) -> tuple:  # type: ignore[type-arg]
    return snap.nodes, snap.devices, snap.pools
