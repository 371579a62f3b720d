"""Placement rules, from the user's side: where do my replicas go, and why not."""

from __future__ import annotations

import pytest

from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.placement.registry import POLICIES, make_policy, policy_names
from gpupool.scheduling.scheduler import schedule
from tests.scheduling.builders import SnapshotBuilder


def devices_of(decision, job_id):  # type: ignore[no-untyped-def]
    start = decision.start_of(job_id)
    assert start is not None, decision.pending.get(job_id)
    return [d for r in start.replicas for d in r.devices]


def test_a_whole_gpu_job_gets_one_device_uuid_with_all_its_memory():
    d = schedule(SnapshotBuilder().node("n1", gpus=2).job("j", gpus=1).build())
    start = d.start_of("j")
    assert start is not None
    (replica,) = start.replicas
    assert replica.node == "n1"
    assert len(replica.devices) == 1
    assert replica.devices[0].startswith("n1-gpu")
    assert replica.milli_per_device == 1000
    assert replica.memory_per_device_mib == 81920


def test_two_half_gpu_jobs_share_one_device_under_bestfit():
    snap = SnapshotBuilder().node("n1", gpus=2).job("a", gpus=0.5).job("b", gpus=0.5).build()
    d = schedule(snap)
    assert devices_of(d, "a") == devices_of(d, "b")
    start = d.start_of("a")
    assert start is not None
    assert start.replicas[0].memory_per_device_mib == 40960  # half the memory of an 80 GiB card


def test_spread_puts_two_half_gpu_jobs_on_different_devices():
    snap = (
        SnapshotBuilder()
        .pool("default", placement="spread")
        .node("n1", gpus=2)
        .job("a", gpus=0.5)
        .job("b", gpus=0.5)
        .build()
    )
    d = schedule(snap)
    assert devices_of(d, "a") != devices_of(d, "b")


def test_a_fraction_needs_memory_and_share_on_the_same_device():
    # gpu0 has share but no memory left; gpu1 has memory but no share: the job fits neither.
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=2)
        .run("x", node="n1", devices=[0], milli=200, memory=81920)
        .run("y", node="n1", devices=[1], milli=900, memory=1024)
        .job("j", gpus=0.3, memory="10GiB")
        .build()
    )
    d = schedule(snap)
    assert d.start_of("j") is None
    assert d.pending["j"].reason is PendingReason.INSUFFICIENT_MEMORY


def test_a_multi_gpu_job_stays_on_one_node_inside_one_nvlink_group():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=8, nvlink=[0, 0, 0, 0, 1, 1, 1, 1])
        .run("x", node="n1", devices=[0], milli=1000)  # group 0 has 3 free, group 1 has 4
        .job("j", gpus=4)
        .build()
    )
    d = schedule(snap)
    assert devices_of(d, "j") == [f"n1-gpu{i}" for i in (4, 5, 6, 7)]


def test_nvlink_prefers_the_group_that_fits_most_tightly():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=8, nvlink=[0, 0, 0, 0, 1, 1, 1, 1])
        .run("x", node="n1", devices=[0, 1], milli=1000)  # group 0: 2 free, group 1: 4 free
        .job("j", gpus=2)
        .build()
    )
    assert devices_of(schedule(snap), "j") == ["n1-gpu2", "n1-gpu3"]


def test_a_gang_that_fits_on_one_node_is_kept_on_one_node():
    snap = SnapshotBuilder().node("n1", gpus=4).node("n2", gpus=4).job("g", gpus=2, replicas=2)
    d = schedule(snap.build())
    start = d.start_of("g")
    assert start is not None
    assert [r.rank for r in start.replicas] == [0, 1]
    assert {r.node for r in start.replicas} == {start.replicas[0].node}
    assert len(set(devices_of(d, "g"))) == 4


def test_a_gang_spans_nodes_when_no_node_holds_all_of_it():
    snap = SnapshotBuilder().node("n1", gpus=4).node("n2", gpus=4).job("g", gpus=4, replicas=2)
    start = schedule(snap.build()).start_of("g")
    assert start is not None
    assert sorted(r.node for r in start.replicas) == ["n1", "n2"]


def test_a_gang_starts_whole_or_not_at_all():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .node("n2", gpus=4)
        .node("n3", gpus=4)
        .run("x", node="n3", devices=[0], milli=1000)
        .job("g", gpus=4, replicas=3)
        .build()
    )
    d = schedule(snap)
    assert d.starts == ()
    assert d.pending["g"].reason is PendingReason.GANG_INCOMPLETE
    assert "2 of the 3 replicas" in d.pending["g"].message


def test_a_gang_larger_than_the_pool_is_too_large_not_waiting():
    snap = SnapshotBuilder().node("n1", gpus=4).job("g", gpus=4, replicas=2).build()
    d = schedule(snap)
    assert d.pending["g"].reason is PendingReason.TOO_LARGE
    assert d.pending["g"].estimated_start is None


def test_gpu_types_pick_the_allowed_model():
    snap = (
        SnapshotBuilder()
        .node("a100", gpus=4, model="NVIDIA A100-SXM4-80GB")
        .node("t4", gpus=4, model="Tesla T4", memory_mib=15360)
        .job("j", gpus=1, gpu_types=["T4"])
        .build()
    )
    start = schedule(snap).start_of("j")
    assert start is not None
    assert start.replicas[0].node == "t4"


def test_no_device_of_the_allowed_type_says_so():
    snap = SnapshotBuilder().node("n1", model="A100").job("j", gpu_types=["H100"]).build()
    d = schedule(snap)
    assert d.pending["j"].reason is PendingReason.NO_DEVICE_OF_TYPE
    assert "allowed type" in d.pending["j"].message


def test_memory_overcommit_lets_the_pool_promise_more_than_exists():
    def third_job_starts(overcommit: float) -> bool:
        snap = (
            SnapshotBuilder()
            .pool("default", overcommit=overcommit)
            .node("n1", gpus=1)
            .job("a", gpus=0.3, memory="40GiB")
            .job("b", gpus=0.3, memory="40GiB")
            .job("c", gpus=0.3, memory="40GiB")
            .build()
        )
        return schedule(snap).start_of("c") is not None

    assert not third_job_starts(1.0)
    assert third_job_starts(1.5)


def test_unhealthy_devices_and_draining_nodes_get_no_work():
    from gpupool.domain.nodes import NodeState

    snap = (
        SnapshotBuilder()
        .node("sick", gpus=2, unhealthy=[0, 1])
        .node("drain", gpus=2, state=NodeState.DRAINING)
        .node("ok", gpus=2)
        .job("a", gpus=2)
        .job("b", gpus=3)
        .build()
    )
    d = schedule(snap)
    assert devices_of(d, "a") == ["ok-gpu0", "ok-gpu1"]
    assert d.pending["b"].reason is PendingReason.TOO_LARGE  # only "ok" counts


def test_cpu_and_host_memory_count_on_the_node():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=2, cpus=8, host_memory="64GiB")
        .job("a", gpus=1, cpus=6)
        .job("b", gpus=1, cpus=4)
        .job("c", gpus=0, cpus=1, host_memory="100GiB")
        .build()
    )
    d = schedule(snap)
    assert d.start_of("a") is not None
    assert d.pending["b"].reason is PendingReason.INSUFFICIENT_CPU
    assert d.pending["c"].reason is PendingReason.TOO_LARGE


def test_jobs_only_use_their_own_pool():
    snap = (
        SnapshotBuilder()
        .node("t1", gpus=2, pool="teaching")
        .node("r1", gpus=2, pool="research")
        .job("j", gpus=2, pool="teaching")
        .job("k", gpus=2, pool="teaching")
        .build()
    )
    d = schedule(snap)
    assert devices_of(d, "j") == ["t1-gpu0", "t1-gpu1"]
    assert d.start_of("k") is None


def test_bestfit_and_spread_are_registered_and_unknown_names_are_explained():
    assert {"bestfit", "spread"} <= set(policy_names())
    assert set(POLICIES) == set(policy_names())
    from gpupool.domain.errors import InvalidValue

    with pytest.raises(InvalidValue, match="use one of default"):
        make_policy("nope")


def test_a_pool_naming_an_unknown_policy_fails_with_the_list():
    from gpupool.domain.errors import InvalidValue

    snap = SnapshotBuilder().pool("default", placement="magic").node("n1").job("j").build()
    with pytest.raises(InvalidValue, match="magic"):
        schedule(snap)


def test_config_default_placement_applies_to_default_pools():
    snap = SnapshotBuilder().node("n1", gpus=2).job("a", gpus=0.5).job("b", gpus=0.5).build()
    d = schedule(snap, SchedulerConfig(default_placement="spread"))
    assert devices_of(d, "a") != devices_of(d, "b")


def test_an_empty_cluster_says_too_large_and_a_cpu_only_node_runs_cpu_jobs():
    from gpupool.domain.nodes import Node

    d = schedule(SnapshotBuilder().job("a", gpus=1).job("c", gpus=0).build())
    assert {v.reason for v in d.pending.values()} == {PendingReason.TOO_LARGE}
    b = SnapshotBuilder()
    b.nodes.append(Node("cpu1", 8000, 1024))
    d = schedule(b.job("c", gpus=0).job("g", gpus=1).build())
    start = d.start_of("c")
    assert start is not None
    assert start.replicas[0].node == "cpu1"
    assert start.replicas[0].devices == ()
    assert d.pending["g"].reason is PendingReason.TOO_LARGE


def test_a_pools_policy_is_shown_every_shape_in_arrival_order(monkeypatch):
    from gpupool.scheduling.placement.base import PolicyOptions, Shape
    from gpupool.scheduling.placement.bestfit import BestFit

    seen: list[Shape] = []

    class Recorder(BestFit):
        name = "recorder"
        learns = True  # BestFit itself does not learn: the scheduler would skip it

        def observe(self, shape: Shape) -> None:
            seen.append(shape)

    def factory(options: PolicyOptions) -> Recorder:
        return Recorder(options)

    monkeypatch.setitem(POLICIES, "recorder", factory)
    snap = (
        SnapshotBuilder()
        .pool("default", placement="recorder")
        .node("n1", gpus=4)
        .run("r", node="n1", devices=[0], milli=1000, memory=81920, start=0.0)
        .job("late", gpus=0.5, submit=20)
        .job("early", gpus=2, submit=10, replicas=2)
        .build()
    )
    schedule(snap)
    assert [(s.milli, s.count) for s in seen] == [(1000, 1), (1000, 2), (1000, 2), (500, 1)]
    seen.clear()
    Recorder.learns = False
    schedule(snap)
    assert seen == []  # a policy that says it does not learn is shown nothing


def test_each_pool_gets_its_own_reservation():
    b = SnapshotBuilder(now=1000).node("a", gpus=2, pool="p1").node("b", gpus=2, pool="p2")
    b.run("ra", node="a", devices=[0], pool="p1", expected_end=2000)
    b.run("rb", node="b", devices=[0], pool="p2", expected_end=3000)
    snap = b.job("x", gpus=2, pool="p1").job("y", gpus=2, pool="p2").build()
    d = schedule(snap)
    assert {(r.pool, r.job_id, r.start_time) for r in d.reservations} == {
        ("p1", "x", 2000),
        ("p2", "y", 3000),
    }
