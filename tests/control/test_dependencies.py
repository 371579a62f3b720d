"""Dependencies against the store and the real loop (issue 27): singleton, aftercorr on job
arrays, afternotok, a dependency on an array id, and a cancel of the target."""

from __future__ import annotations

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.arrays import submit_array
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from tests.control.builders import ADMIN, exited, heartbeat, register, running, submit


def _loop(cp: ControlPlane) -> SchedulingLoop:
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    return loop


def _detail(cp: ControlPlane, job_id: str) -> tuple[JobState, str | None, str | None]:
    d = JobService(cp).get(ADMIN.principal, job_id)
    return d.job.state, d.pending_reason, d.job.reason


def _finish(cp: ControlPlane, loop: SchedulingLoop, code: int = 0) -> list[str]:
    """One cycle; every replica it started runs and exits with ``code``; the job ids."""
    loop.cycle()
    orders = heartbeat(cp).start
    heartbeat(cp, replicas=[running(o.assignment_id) for o in orders])
    heartbeat(cp, replicas=[exited(o.assignment_id, code=code) for o in orders])
    return [o.job_id for o in orders]


def test_singleton_runs_one_job_of_a_name_at_a_time(cp: ControlPlane) -> None:
    register(cp, gpus=2)
    loop = _loop(cp)
    a = submit(cp, "nightly", dependency="singleton")
    b = submit(cp, "nightly", dependency="singleton")
    other = submit(cp, "other", dependency="singleton")
    first = _finish(cp, loop)
    # One of a and b (same name and user; submitted at the same instant of the test's clock,
    # so the earlier by id) runs with other; the second waits for it, then runs.
    assert other.id in first
    assert len(first) == 2
    (one,) = set(first) & {a.id, b.id}
    (two,) = {a.id, b.id} - {one}
    assert _finish(cp, loop) == [two]


def test_aftercorr_runs_each_task_after_the_same_index(cp: ControlPlane) -> None:
    register(cp, gpus=2)
    loop = _loop(cp)
    spec = {"name": "prep", "command": ["true"], "resources": {"gpus": "0.25"}}
    first, _ = submit_array(JobService(cp), ADMIN, spec, "0-1")
    array = first[0].array
    assert array is not None
    then = {**spec, "name": "train", "dependency": f"aftercorr:{array.array_id}"}
    second, _ = submit_array(JobService(cp), ADMIN, then, "0-1")
    loop.cycle()
    for task in second:
        state, reason, _ = _detail(cp, task.id)
        assert state is JobState.PENDING
        assert reason is not None
        assert reason.startswith("Dependency: aftercorr: waits for job")
    orders = heartbeat(cp).start
    heartbeat(cp, replicas=[running(o.assignment_id) for o in orders])
    by_job = {o.job_id: o for o in orders}
    heartbeat(cp, replicas=[exited(by_job[first[0].id].assignment_id, code=0)])
    heartbeat(cp, replicas=[exited(by_job[first[1].id].assignment_id, code=1)])
    # Task 0 of train may run; task 1's partner failed: it ends.
    assert _finish(cp, loop) == [second[0].id]
    state, _, reason = _detail(cp, second[1].id)
    assert state is JobState.CANCELLED
    assert reason is not None
    assert reason.startswith("DependencyNeverSatisfied: aftercorr:")


def test_afternotok_and_a_dependency_on_an_array_id(cp: ControlPlane) -> None:
    register(cp, gpus=2)
    loop = _loop(cp)
    spec = {"name": "sweep", "command": ["true"], "resources": {"gpus": "0.25"}}
    tasks, _ = submit_array(JobService(cp), ADMIN, spec, "0-2")
    assert tasks[0].array is not None
    whole = tasks[0].array.array_id
    report = submit(cp, "report", dependency=f"afterok:{whole}")
    rescue = submit(cp, "rescue", dependency=f"afternotok:{tasks[0].id}")
    assert sorted(_finish(cp, loop)) == sorted(t.id for t in tasks)
    assert _finish(cp, loop) == [report.id]  # every task of the array completed
    state, _, reason = _detail(cp, rescue.id)
    assert state is JobState.CANCELLED  # its target completed: it never failed
    assert reason == (
        f"DependencyNeverSatisfied: afternotok: job {tasks[0].id} COMPLETED, it did not fail"
    )


def test_cancelling_the_target_ends_afterok_and_starts_afterany(cp: ControlPlane) -> None:
    register(cp, gpus=2)
    loop = _loop(cp)
    target = JobService(cp).submit(
        ADMIN, {"name": "t", "command": ["true"], "resources": {"gpus": "0.5"}}, held=True
    )[0]
    ok = submit(cp, "ok", dependency=f"afterok:{target.id}")
    anyway = submit(cp, "any", dependency=f"afterany:{target.id}")
    loop.cycle()
    assert _detail(cp, ok.id)[1] == (
        f"Dependency: afterok: waits for job {target.id} to complete (PENDING now)"
    )
    JobService(cp).cancel(ADMIN, target.id)
    assert _finish(cp, loop) == [anyway.id]
    assert _detail(cp, ok.id)[0] is JobState.CANCELLED
