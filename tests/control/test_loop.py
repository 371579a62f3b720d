"""The scheduling loop against the store with the real scheduler: placement, commit checks,
dispatch through heartbeats, job lifecycles, failure detection and leadership."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.leader import Leadership
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from gpupool.scheduling.decision import Decision, ReplicaStart, Start
from gpupool.scheduling.layout import DEFAULT_CONTEXT_RESERVE_MIB
from gpupool.store.models import AssignmentModel, LeaderModel, SliceModel
from tests.control.builders import ADMIN, exited, heartbeat, register, running, submit


def _loop(cp: ControlPlane, **kw: object) -> SchedulingLoop:
    loop = SchedulingLoop(cp, **kw)  # type: ignore[arg-type]
    assert loop.leadership.try_acquire()
    return loop


def _state(cp: ControlPlane, job_id: str) -> JobState:
    return JobService(cp).get(ADMIN.principal, job_id).job.state


def test_a_submitted_job_is_placed_dispatched_run_and_completed(cp: ControlPlane) -> None:
    register(cp)
    job = submit(cp)
    loop = _loop(cp)
    result = loop.cycle()
    assert result.started == (job.id,)
    assert _state(cp, job.id) is JobState.CONFIGURING
    answer = heartbeat(cp)
    assert [a.job_id for a in answer.start] == [job.id]
    spec = answer.start[0]
    assert spec.milli_per_device == 500
    # half of the 80 GiB card, less the CUDA context the node's soft mode leaves outside the
    # slice (a node that did not report its reserve: the default)
    assert spec.memory_mib_per_device == 40960 - DEFAULT_CONTEXT_RESERVE_MIB
    assert answer.epoch == cp.epoch
    # the order is resent until the agent reports the assignment, then never again
    assert [a.assignment_id for a in heartbeat(cp).start] == [spec.assignment_id]
    assert heartbeat(cp, replicas=[running(spec.assignment_id)]).start == []
    assert _state(cp, job.id) is JobState.RUNNING
    done = heartbeat(cp, replicas=[exited(spec.assignment_id)])
    assert done.finished_ack == [spec.assignment_id]
    detail = JobService(cp).get(ADMIN.principal, job.id)
    assert detail.job.state is JobState.COMPLETED
    assert detail.job.exit_code == 0
    # a duplicate report of the finished replica changes nothing and is acknowledged again
    again = heartbeat(cp, replicas=[exited(spec.assignment_id, code=1)])
    assert again.finished_ack == [spec.assignment_id]
    assert _state(cp, job.id) is JobState.COMPLETED


def test_jobs_that_do_not_fit_wait_with_a_reason(cp: ControlPlane, clock: ManualClock) -> None:
    register(cp, gpus=1)
    first = submit(cp, "a", gpus="1")
    clock.advance(1)
    second = submit(cp, "b", gpus="1")
    loop = _loop(cp)
    assert loop.cycle().started == (first.id,)
    detail = JobService(cp).get(ADMIN.principal, second.id)
    assert detail.job.state is JobState.PENDING
    assert detail.pending_reason is not None
    assert detail.pending_reason.startswith("InsufficientGpu")


def test_a_job_cancelled_after_the_snapshot_is_not_started(cp: ControlPlane) -> None:
    register(cp)
    job = submit(cp)
    loop = _loop(cp)
    real = loop.schedule

    def schedule_then_cancel(snapshot, config, memo):  # type: ignore[no-untyped-def]
        decision = real(snapshot, config, memo)
        JobService(cp).cancel(ADMIN, job.id)  # lands between snapshot and commit
        return decision

    loop._schedule = schedule_then_cancel
    result = loop.cycle()
    assert result.started == ()
    assert result.skipped == (job.id,)
    assert _state(cp, job.id) is JobState.CANCELLED
    with cp.tx() as s:
        assert s.scalar(select(func.count()).select_from(SliceModel)) == 0


def test_a_job_updated_after_the_snapshot_is_not_started_with_its_old_resources(
    cp: ControlPlane,
) -> None:
    register(cp)
    job = submit(cp)  # half a GPU
    loop = _loop(cp)
    real = loop.schedule

    def schedule_then_update(snapshot, config, memo):  # type: ignore[no-untyped-def]
        decision = real(snapshot, config, memo)
        # `gpupool update JOB -g 1` lands between snapshot and commit
        JobService(cp).update(ADMIN, job.id, {"resources": {"gpus": 1}})
        return decision

    loop._schedule = schedule_then_update
    result = loop.cycle()
    assert result.started == ()
    assert result.skipped == (job.id,)
    assert _state(cp, job.id) is JobState.PENDING
    with cp.tx() as s:
        assert s.scalar(select(func.count()).select_from(SliceModel)) == 0
    # the next cycle starts it with what it asks for now: a whole GPU
    loop._schedule = real
    assert loop.cycle().started == (job.id,)
    with cp.tx() as s:
        assert s.scalar(select(func.sum(SliceModel.milli))) == 1000


def test_the_commit_refuses_a_start_that_would_overfill_a_device(cp: ControlPlane) -> None:
    register(cp, gpus=1)
    a, b = submit(cp, "a"), submit(cp, "b", gpus="0.6")

    def greedy(snapshot, config, memo):  # type: ignore[no-untyped-def]
        starts = tuple(
            Start(
                j.id,
                j.tenant,
                j.spec.pool,
                (ReplicaStart(0, "n1", ("n1-gpu0",), j.spec.resources.gpu_milli, 1000, 0, 0),),
            )
            for j in snapshot.pending
        )
        return Decision(starts=starts)

    result = _loop(cp, schedule=greedy).cycle()
    assert len(result.started) == 1
    assert len(result.skipped) == 1
    with cp.tx() as s:
        used = s.scalar(select(func.sum(SliceModel.milli)).where(SliceModel.active.is_(True)))
    assert used is not None
    assert used <= 1000
    del a, b


def test_a_deposed_leader_cannot_commit(cp: ControlPlane) -> None:
    register(cp)
    submit(cp)
    loop = _loop(cp)
    with cp.tx() as s:  # another server took over
        row = s.get(LeaderModel, 1)
        assert row is not None
        row.epoch += 1
    with pytest.raises(NotLeader):
        loop.cycle()
    with cp.tx() as s:
        assert s.scalar(select(func.count()).select_from(SliceModel)) == 0


def test_only_one_server_holds_the_lease(cp: ControlPlane) -> None:
    first = Leadership(cp)
    assert first.try_acquire()
    epoch = cp.epoch
    other = ControlPlane(cp.settings, clock=cp.clock)
    second = Leadership(other)
    try:
        assert not second.try_acquire()
        first.release()
        assert second.try_acquire()
        assert other.epoch == epoch + 1
    finally:
        second.release()
        other.close()


def test_cancelling_a_running_job_sends_a_stop_and_ends_cancelled(cp: ControlPlane) -> None:
    register(cp)
    job = submit(cp)
    _loop(cp).cycle()
    aid = heartbeat(cp).start[0].assignment_id
    heartbeat(cp, replicas=[running(aid)])
    JobService(cp).cancel(ADMIN, job.id)
    assert _state(cp, job.id) is JobState.COMPLETING
    answer = heartbeat(cp, replicas=[running(aid)])
    assert [(o.assignment_id, o.reason.value) for o in answer.stop] == [(aid, "cancel")]
    heartbeat(cp, replicas=[exited(aid, code=-15, signal="SIGTERM")])
    assert _state(cp, job.id) is JobState.CANCELLED


def test_a_job_cancelled_before_its_node_started_it_frees_its_slices(cp: ControlPlane) -> None:
    register(cp, gpus=1)
    job = submit(cp, gpus="1")
    loop = _loop(cp)
    assert loop.cycle().started == (job.id,)
    JobService(cp).cancel(ADMIN, job.id)  # dispatched, the agent has not reported it yet
    assert _state(cp, job.id) is JobState.CANCELLED
    answer = heartbeat(cp)  # the agent knows nothing of it
    assert (answer.start, answer.stop) == ([], [])  # nothing to start, nothing to stop
    with cp.read() as s:
        active = s.scalar(select(func.count()).select_from(SliceModel).where(SliceModel.active))
    assert active == 0
    # The whole GPU is free again: the next job starts.
    other = submit(cp, gpus="1")
    assert loop.cycle().started == (other.id,)
    # Had the node started it after all, it is stopped at once (a replica the server ended).
    late = heartbeat(cp, replicas=[running(next(iter(_assignments(cp, job.id))))])
    assert [o.signal for o in late.stop if o.assignment_id in _assignments(cp, job.id)] == [
        "SIGKILL"
    ]


def _assignments(cp: ControlPlane, job_id: str) -> set[str]:
    with cp.read() as s:
        return set(s.scalars(select(AssignmentModel.id).where(AssignmentModel.job_id == job_id)))


def test_a_silent_node_fails_its_jobs_over_and_they_requeue(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    register(cp, "n2")
    job = submit(cp, requeue="on-preemption")
    loop = _loop(cp)
    loop.cycle()
    node = JobService(cp).get(ADMIN.principal, job.id).nodes[0]
    aid = heartbeat(cp, node).start[0].assignment_id
    heartbeat(cp, node, replicas=[running(aid)])
    clock.advance(cp.settings.node_timeout_s + 1)
    other = "n2" if node == "n1" else "n1"
    heartbeat(cp, other)
    assert loop.nodes.mark_silent_nodes_down(watching_since=0.0) == [node]
    detail = JobService(cp).get(ADMIN.principal, job.id)
    assert detail.job.state is JobState.PENDING
    assert detail.job.restart_count == 1
    events = [e.target for e in JobService(cp).events(ADMIN.principal, job.id)]
    assert JobState.NODE_FAIL in events
    assert loop.cycle().started == (job.id,)
    assert JobService(cp).get(ADMIN.principal, job.id).nodes == (other,)


def test_a_failed_gang_replica_stops_its_siblings(cp: ControlPlane) -> None:
    register(cp, "n1", gpus=1)
    register(cp, "n2", gpus=1)
    job = submit(cp, gpus="1", replicas=2, requeue="never")
    _loop(cp).cycle()
    a1 = heartbeat(cp, "n1").start[0]
    a2 = heartbeat(cp, "n2").start[0]
    assert a1.gang is not None
    assert a2.gang is not None
    assert a1.gang.master_addr == a2.gang.master_addr
    assert {a1.gang.rank, a2.gang.rank} == {0, 1}
    assert a1.gang.world_size == 2
    heartbeat(cp, "n1", replicas=[running(a1.assignment_id)])
    heartbeat(cp, "n2", replicas=[running(a2.assignment_id)])
    heartbeat(cp, "n1", replicas=[exited(a1.assignment_id, code=3)])
    stop = heartbeat(cp, "n2", replicas=[running(a2.assignment_id)]).stop
    assert [o.assignment_id for o in stop] == [a2.assignment_id]
    heartbeat(cp, "n2", replicas=[exited(a2.assignment_id, code=-15, signal="SIGTERM")])
    detail = JobService(cp).get(ADMIN.principal, job.id)
    assert detail.job.state is JobState.FAILED
    assert detail.job.exit_code == 3


def test_a_replica_still_running_after_its_node_was_failed_over_is_killed(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp, "n1")
    job = submit(cp, requeue="on-preemption")
    loop = _loop(cp)
    loop.cycle()
    aid = heartbeat(cp).start[0].assignment_id
    heartbeat(cp, replicas=[running(aid)])
    clock.advance(cp.settings.node_timeout_s + 1)
    assert loop.nodes.mark_silent_nodes_down(watching_since=0.0) == ["n1"]
    back = heartbeat(cp, replicas=[running(aid)])  # the node returns, its replica still runs
    assert [(o.assignment_id, o.signal) for o in back.stop] == [(aid, "SIGKILL")]
    assert back.finished_ack == []
    done = heartbeat(cp, replicas=[exited(aid, code=-9, signal="SIGKILL")])
    assert done.finished_ack == [aid]
    assert JobService(cp).get(ADMIN.principal, job.id).job.restart_count == 1
