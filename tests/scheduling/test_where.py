"""``--nodelist`` / ``--exclude`` in the scheduler and the ``ReqNodeNotAvail`` reason (issue 27)."""

from __future__ import annotations

from dataclasses import replace

from gpupool.domain.nodes import NodeState
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder


def _restricted(snap: ClusterSnapshot, job_id: str, **where: tuple[str, ...]) -> ClusterSnapshot:
    jobs = tuple(
        j.with_changes(spec=replace(j.spec, **where)) if j.id == job_id else j for j in snap.pending
    )
    return replace(snap, pending=jobs)


def test_nodelist_and_exclude_place_only_where_they_say() -> None:
    base = SnapshotBuilder().node("a", gpus=2).node("b", gpus=2).node("c", gpus=2)
    snap = base.job("only-c", gpus=1).job("not-ab", gpus=1).job("any", gpus=1).build()
    snap = _restricted(snap, "only-c", nodelist=("c",))
    snap = _restricted(snap, "not-ab", exclude=("a", "b"))
    d = schedule(snap)
    for job_id in ("only-c", "not-ab"):
        start = d.start_of(job_id)
        assert start is not None
        assert [r.node for r in start.replicas] == ["c"]
    assert d.start_of("any") is not None


def test_a_full_nodelist_waits_for_its_nodes_though_others_are_free() -> None:
    snap = (
        SnapshotBuilder()
        .node("a", gpus=1)
        .node("b", gpus=1)
        .run("r", node="a", devices=[0], milli=1000)
        .job("on-a", gpus=1)
        .build()
    )
    d = schedule(_restricted(snap, "on-a", nodelist=("a",)))
    assert d.start_of("on-a") is None
    assert d.pending["on-a"].reason is PendingReason.INSUFFICIENT_GPU


def test_a_job_only_a_drained_node_could_hold_says_req_node_not_avail() -> None:
    snap = (
        SnapshotBuilder()
        .node("small", gpus=1)
        .node("big", gpus=4, state=NodeState.DRAINED)
        .job("wide", gpus=4)
        .job("huge", gpus=8)
        .build()
    )
    d = schedule(snap)
    wide = d.pending["wide"]
    assert wide.reason is PendingReason.REQ_NODE_NOT_AVAIL
    assert "node(s) big (drained) of the pool are not available" in wide.message
    assert "wide" not in d.unfit
    assert d.pending["huge"].reason is PendingReason.TOO_LARGE  # no node could, back or not
