"""``--time-min`` and ``--constraint`` in the scheduler, with no I/O (issue 27).

``--time-min``: a job the reservation holds back starts with the longest limit that ends by
the reserved start, never below its ``time_min``; without ``time_min`` it waits. ``--constraint``:
a job runs only on nodes whose features satisfy it, and waits with ``BadConstraints`` when no
node of its pool has them.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.domain.interactive import parse_constraint
from gpupool.domain.nodes import NodeState
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder

NOW = 10_000.0


def _changed(snap: ClusterSnapshot, job_id: str, **changes: object) -> ClusterSnapshot:
    jobs = tuple(
        j.with_changes(spec=replace(j.spec, **changes)) if j.id == job_id else j
        for j in snap.pending
    )
    return replace(snap, pending=jobs)


def _reserved_gap() -> SnapshotBuilder:
    """n1's 4 GPUs: 2 busy until t=12000, and "big" (all 4) first in line: reserved then."""
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4)
    for i in range(2):
        b.run(f"r{i}", node="n1", devices=[i], expected_end=12_000)
    return b.job("big", gpus=4, submit=1, expected=3600)


def test_time_min_backfills_with_the_limit_that_ends_before_the_reservation() -> None:
    snap = (
        _reserved_gap()
        .job("plain", gpus=1, submit=2, time_limit=5000)
        .job("short", gpus=1, submit=3, time_limit=5000)
        .build()
    )
    snap = _changed(snap, "short", time_min_s=1500.0)
    d = schedule(snap, SchedulerConfig(ordering="fifo"))
    assert d.pending["plain"].reason is PendingReason.WAITING_FOR_RESERVATION
    start = d.start_of("short")
    assert start is not None
    assert start.time_limit_s == 2000.0  # 12000 - 10000: ends as big starts
    (res,) = d.reservations
    assert res.job_id == "big"
    assert res.start_time == 12_000  # not delayed


def test_time_min_longer_than_the_gap_waits() -> None:
    snap = _reserved_gap().job("short", gpus=1, submit=2, time_limit=5000).build()
    d = schedule(_changed(snap, "short", time_min_s=2500.0), SchedulerConfig(ordering="fifo"))
    assert d.start_of("short") is None
    assert d.pending["short"].reason is PendingReason.WAITING_FOR_RESERVATION


def test_a_job_that_fits_with_its_own_limit_keeps_it() -> None:
    snap = _reserved_gap().job("quick", gpus=1, submit=2, time_limit=1000).build()
    d = schedule(_changed(snap, "quick", time_min_s=500.0), SchedulerConfig(ordering="fifo"))
    start = d.start_of("quick")
    assert start is not None
    assert start.time_limit_s is None  # nothing shortened: its own limit applies


def _featured(snap: ClusterSnapshot, features: dict[str, tuple[str, ...]]) -> ClusterSnapshot:
    nodes = tuple(replace(n, features=features.get(n.name, ())) for n in snap.nodes)
    return replace(snap, nodes=nodes)


def _nodes() -> SnapshotBuilder:
    return SnapshotBuilder().node("a", gpus=2).node("b", gpus=2).node("c", gpus=2)


def test_constraint_places_only_on_nodes_with_the_features() -> None:
    snap = _nodes().job("ib-a100", gpus=1).job("either", gpus=2).job("any", gpus=1).build()
    snap = _featured(snap, {"a": ("ib",), "b": ("a100x8", "ib"), "c": ("h100",)})
    snap = _changed(snap, "ib-a100", constraint=parse_constraint("ib&a100x8"))
    snap = _changed(snap, "either", constraint=parse_constraint("h100|nvlink&ib"))
    d = schedule(snap)
    for job_id, node in (("ib-a100", "b"), ("either", "c")):
        start = d.start_of(job_id)
        assert start is not None
        assert {r.node for r in start.replicas} == {node}
    assert d.start_of("any") is not None


def test_a_constraint_no_node_has_waits_with_bad_constraints() -> None:
    snap = _featured(_nodes().job("nv", gpus=1).build(), {"a": ("ib",)})
    d = schedule(_changed(snap, "nv", constraint=parse_constraint("nvlink")))
    info = d.pending["nv"]
    assert info.reason is PendingReason.BAD_CONSTRAINTS
    assert "--constraint 'nvlink'" in info.message
    assert "features of the pool's nodes: ib" in info.message


def test_features_of_a_drained_node_say_req_node_not_avail() -> None:
    snap = _nodes().job("nv", gpus=1).build()
    nodes = tuple(
        replace(n, features=("nvlink",), state=NodeState.DRAINED) if n.name == "a" else n
        for n in snap.nodes
    )
    snap = replace(snap, nodes=nodes)
    d = schedule(_changed(snap, "nv", constraint=parse_constraint("nvlink")))
    assert d.pending["nv"].reason is PendingReason.REQ_NODE_NOT_AVAIL
