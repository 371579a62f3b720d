"""Every path that ends an assignment keeps the same books (one shared check, ``ended_well``):
its slices are free, its usage accrued, its gang siblings on other nodes ordered to stop AND
those nodes rung (the agents' long polls wake now, not at their next periodic heartbeat), and
the job finished or requeued as its policy says.

The paths: an exit report (non-zero, and a boot failure), a node lost, replicas stopped before
their node took them, a cancel, and a preempted replica's exit. Each test places a 2-replica
gang across two one-GPU nodes (``n1`` holds rank 0, ``n2`` rank 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.jobs import JobService
from gpupool.control.services.nodes import NodeService
from gpupool.domain.states import JobState
from gpupool.scheduling.config import SchedulerConfig
from gpupool.schemas.agent import ReplicaState, ReplicaStatus, StopReason
from gpupool.store.models import AssignmentModel, JobModel, SliceModel, UsageModel
from tests.control.builders import ADMIN, exited, heartbeat, register, running, submit

HELD_S = 60.0  # seconds each gang holds its slices before the end under test


@dataclass(frozen=True)
class Gang:
    job_id: str
    by_node: dict[str, str]  # node -> assignment id (n1: rank 0, n2: rank 1)


def place_gang(cp: ControlPlane, *, report: bool = True, **spec: Any) -> Gang:
    """A 2-replica gang of one GPU per replica over n1 and n2; running when ``report``."""
    register(cp, "n1", gpus=1)
    register(cp, "n2", gpus=1)
    job = submit(cp, "gang", replicas=2, resources={"gpus": "1", "cpus": "1"}, **spec)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == (job.id,)
    with cp.read() as s:
        rows = s.scalars(select(AssignmentModel).where(AssignmentModel.job_id == job.id))
        by_node = {a.node: a.id for a in rows}
    assert sorted(by_node) == ["n1", "n2"]
    if report:
        for node, aid in by_node.items():
            heartbeat(cp, node, [running(aid)])
        assert JobService(cp).get(ADMIN.principal, job.id).job.state is JobState.RUNNING
    return Gang(job.id, by_node)


def rung(cp: ControlPlane) -> dict[str, int]:
    """Each node's order sequence now (a node is rung when its sequence grows)."""
    return {n: cp.orders.seq(n) for n in ("n1", "n2")}


def ended_well(
    cp: ControlPlane,
    gang: Gang,
    ended: str,
    *,
    before: dict[str, int],
    sibling_reason: str | None,
    job_state: JobState,
    restarts: int = 0,
) -> None:
    """The shared bookkeeping check after the replica on node ``ended`` ended (``before``: the
    order sequences just before). ``sibling_reason``: the stop order the other replica must
    hold now (``None``: it has ended too)."""
    sibling_node = "n2" if ended == "n1" else "n1"
    aid, sibling = gang.by_node[ended], gang.by_node[sibling_node]
    with cp.read() as s:
        a = s.get(AssignmentModel, aid)
        assert a is not None
        assert (a.state, a.ended_at is not None) == ("finished", True)
        active = s.scalar(
            select(func.count(SliceModel.id)).where(
                SliceModel.assignment_id == aid, SliceModel.active.is_(True)
            )
        )
        assert active == 0, "the ended replica still holds its slices"
        used = s.scalar(
            select(func.sum(UsageModel.milli_seconds)).where(
                UsageModel.job_id == gang.job_id, UsageModel.device_uuid == f"{ended}-gpu0"
            )
        )
        assert (used or 0) >= 1000 * HELD_S, "its usage was not accrued"
        other = s.get(AssignmentModel, sibling)
        assert other is not None
        if sibling_reason is not None:
            assert other.state != "finished"
            assert other.stop_reason == sibling_reason, "the gang sibling was not told to stop"
            assert cp.orders.seq(sibling_node) > before[sibling_node], (
                f"{sibling_node} was not rung: its agent learns of the stop only at its next "
                "heartbeat"
            )
        else:
            assert other.state == "finished"
        job = s.get(JobModel, gang.job_id)
        assert job is not None
        assert (job.state, job.restart_count) == (job_state.value, restarts), job.reason


def test_a_failed_exit_report_ends_the_replica_and_rings_the_siblings_node(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp)
    clock.advance(HELD_S)
    before = rung(cp)
    heartbeat(cp, "n1", [exited(gang.by_node["n1"], code=3)])
    ended_well(cp, gang, "n1", before=before, sibling_reason="gang", job_state=JobState.RUNNING)
    stop = heartbeat(cp, "n2", [running(gang.by_node["n2"])]).stop
    assert [(o.assignment_id, o.reason) for o in stop] == [(gang.by_node["n2"], StopReason.CANCEL)]
    heartbeat(cp, "n2", [exited(gang.by_node["n2"], code=143)])
    ended_well(cp, gang, "n2", before=before, sibling_reason=None, job_state=JobState.FAILED)


def test_a_boot_failure_ends_the_replica_and_the_gang_requeues(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp, report=False)
    heartbeat(cp, "n2", [running(gang.by_node["n2"])])
    clock.advance(HELD_S)
    before = rung(cp)
    boot = ReplicaStatus(
        assignment_id=gang.by_node["n1"], state=ReplicaState.BOOT_FAILED, reason="no such file"
    )
    heartbeat(cp, "n1", [boot])
    ended_well(cp, gang, "n1", before=before, sibling_reason="gang", job_state=JobState.RUNNING)
    heartbeat(cp, "n2", [exited(gang.by_node["n2"], code=0, signal="SIGTERM")])
    ended_well(
        cp, gang, "n2", before=before, sibling_reason=None, job_state=JobState.PENDING, restarts=1
    )


def test_a_lost_node_ends_its_replica_and_rings_the_siblings_node(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp, requeue="on-preemption")
    clock.advance(HELD_S)
    heartbeat(cp, "n2", [running(gang.by_node["n2"])])  # n2 lives on; n1 falls silent
    clock.advance(cp.settings.node_timeout_s + 1)
    heartbeat(cp, "n2", [running(gang.by_node["n2"])])
    before = rung(cp)
    assert NodeService(cp).mark_silent_nodes_down(watching_since=0.0) == ["n1"]
    ended_well(cp, gang, "n1", before=before, sibling_reason="gang", job_state=JobState.RUNNING)
    heartbeat(cp, "n2", [exited(gang.by_node["n2"], code=0, signal="SIGTERM")])
    ended_well(
        cp, gang, "n2", before=before, sibling_reason=None, job_state=JobState.PENDING, restarts=1
    )
    with cp.read() as s:
        a = s.get(AssignmentModel, gang.by_node["n1"])
        assert a is not None
        assert a.stop_reason == "node"


def test_replicas_stopped_before_their_nodes_took_them_end_at_the_next_heartbeat(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp, report=False)
    clock.advance(HELD_S)
    before = rung(cp)
    JobService(cp).cancel(ADMIN, gang.job_id)
    after = rung(cp)
    assert all(after[n] > before[n] for n in after), "cancel rings both nodes"
    answer = heartbeat(cp, "n1")  # n1 never reported its replica: it ends unstarted
    assert answer.start == []
    ended_well(cp, gang, "n1", before=before, sibling_reason="cancel", job_state=JobState.CANCELLED)
    heartbeat(cp, "n2")
    ended_well(cp, gang, "n2", before=before, sibling_reason=None, job_state=JobState.CANCELLED)


def test_a_cancelled_replicas_exit_ends_it_and_the_job_is_cancelled(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp)
    clock.advance(HELD_S)
    before = rung(cp)
    JobService(cp).cancel(ADMIN, gang.job_id)
    assert rung(cp)["n1"] > before["n1"]
    heartbeat(
        cp, "n1", [exited(gang.by_node["n1"], code=0, signal="SIGTERM", why=StopReason.CANCEL)]
    )
    ended_well(
        cp, gang, "n1", before=before, sibling_reason="cancel", job_state=JobState.COMPLETING
    )
    heartbeat(
        cp, "n2", [exited(gang.by_node["n2"], code=0, signal="SIGTERM", why=StopReason.CANCEL)]
    )
    ended_well(cp, gang, "n2", before=before, sibling_reason=None, job_state=JobState.CANCELLED)


def test_a_preempted_replicas_exit_ends_it_and_the_job_requeues(
    cp: ControlPlane, clock: ManualClock
) -> None:
    gang = place_gang(cp, priority="low", preemptible=True)
    clock.advance(SchedulerConfig().preempt_exempt_s + HELD_S)  # past its exemption
    before = rung(cp)
    high = submit(cp, "high", resources={"gpus": "1", "cpus": "1"}, priority="high")
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().preempted == (gang.job_id,)
    assert all(seq > before[n] for n, seq in rung(cp).items()), "the victims' nodes are rung"
    heartbeat(cp, "n2", [exited(gang.by_node["n2"], code=0, why=StopReason.PREEMPT)])
    ended_well(
        cp, gang, "n2", before=before, sibling_reason="preempt", job_state=JobState.COMPLETING
    )
    heartbeat(cp, "n1", [exited(gang.by_node["n1"], code=0, why=StopReason.PREEMPT)])
    ended_well(
        cp, gang, "n1", before=before, sibling_reason=None, job_state=JobState.PENDING, restarts=1
    )
    with cp.read() as s:
        stop_for = {a.stop_for for a in s.scalars(select(AssignmentModel))}
    assert high.id in stop_for
