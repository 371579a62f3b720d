"""Free capacity built from a snapshot: what the placement stage starts from."""

from __future__ import annotations

import numpy as np

from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.placement.base import Shape, topology_slots
from gpupool.scheduling.release import Release
from gpupool.scheduling.reservation import Timeline
from tests.scheduling.builders import SnapshotBuilder


def test_running_replicas_are_subtracted_from_their_devices_and_node():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=2, cpus=8, host_memory="64GiB")
        .run("r", node="n1", devices=[1], milli=300, memory=10240, cpus=2, host_memory="8GiB")
        .build()
    )
    cap = build_capacity(snap)
    a = cap.arrays
    row, slot = cap.uuid_slot["n1-gpu1"]
    assert a.free_milli[row].tolist() == [1000, 700]
    assert a.free_mem[row, slot] == 81920 - 10240
    assert a.cpu_free[row] == 6000
    assert a.host_mem_free[row] == 56 * 1024


def test_overcommit_raises_promisable_memory_but_not_the_proportional_share():
    snap = SnapshotBuilder().pool("big", overcommit=1.5).node("n1", gpus=1, pool="big").build()
    cap = build_capacity(snap)
    view = cap.view("big")
    assert view.free_mem[0, 0] == int(81920 * 1.5)
    half = Shape(milli=500, count=1)
    assert view.memory_need(half, 0)[0] == 40960  # half of the physical card


def test_pool_views_share_free_capacity_but_not_usability():
    snap = SnapshotBuilder().node("a", gpus=1, pool="p1").node("b", gpus=1, pool="p2").build()
    cap = build_capacity(snap)
    p1, p2 = cap.view("p1"), cap.view("p2")
    assert p1.free_milli is p2.free_milli
    assert p1.usable.sum() == 1
    assert p2.usable.sum() == 1
    assert not (p1.usable & p2.usable).any()
    assert cap.nodes_of("p1").tolist() == [True, False]


def test_a_mixed_model_node_uses_every_device_with_its_own_model():
    snap = SnapshotBuilder().node("n1", gpus=2, model="A100").build()
    from dataclasses import replace

    odd = replace(snap.devices[1], model="T4")
    snap = replace(snap, devices=(snap.devices[0], odd))
    cap = build_capacity(snap)
    assert cap.arrays.usable.tolist() == [[True, True]]
    assert [cap.arrays.model_names[m] for m in cap.arrays.slot_model[0]] == ["A100", "T4"]


def test_topology_slots_fall_back_to_index_order_without_nvlink_information():
    snap = SnapshotBuilder().node("n1", gpus=4).build()
    cap = build_capacity(snap)
    assert topology_slots(cap.arrays, Shape(1000, 2), 0) == (0, 1)


def test_the_timeline_finds_the_first_release_after_which_a_job_fits():
    b = SnapshotBuilder(now=0).node("n1", gpus=100, cpus=128)
    for i in range(100):
        b.run(f"r{i}", node="n1", devices=[i], expected_end=float(100 + i))
    snap = b.build()
    cap = build_capacity(snap)
    releases = []
    for r in snap.running:
        held = cap.held_by(r)
        assert held is not None
        releases.append(Release(r.expected_end, held[0], held[1]))
    timeline = Timeline(cap.view("default"), releases, 0.0)

    def fits(k: int):  # type: ignore[no-untyped-def]
        return lambda arrays: bool(arrays.feasible_nodes(Shape(1000, k)).any())

    assert timeline.estimate(fits(1)) == 100
    assert timeline.estimate(fits(7)) == 106
    assert timeline.estimate(fits(53)) == 152
    assert timeline.estimate(fits(100)) == 199
    assert timeline.estimate(fits(101)) is None
    found = timeline.earliest(fits(7))
    assert found is not None
    assert int(np.sum(found[1].free_milli == 1000)) == 7
    assert cap.arrays.free_milli.sum() == 0  # the live arrays are untouched
