"""The scheduling loop with a deep queue: the work of a cycle around the scheduler (the
snapshot, the commit) does not grow with every queued job, and what it skips is still right.

Counted in SQL statements and specs parsed, never in seconds (the speed figures are in
``benchmarks/bench_live_loop.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.machinery.snapshot import build_snapshot
from gpupool.control.services.jobs import JobService
from gpupool.control.services.jobviews import JobFilter
from gpupool.domain.states import JobState
from tests.control.builders import ADMIN, register, submit


def _loop(cp: ControlPlane) -> SchedulingLoop:
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    return loop


def _busy_pool(cp: ControlPlane, loop: SchedulingLoop) -> None:
    """Four GPUs, 3.5 of them held by running jobs: a queued 1-GPU job cannot start."""
    register(cp, gpus=4)
    for gpus in ("1", "1", "1", "0.5"):
        submit(cp, "big", gpus=gpus)
    assert len(loop.cycle().started) == 4


def _queue(cp: ControlPlane, n: int) -> None:
    jobs = JobService(cp)
    spec = {"command": ["sleep", "1"], "resources": {"gpus": "1"}}
    items = [jobs.prepare(ADMIN, {"name": f"q{i}", **spec}, None) for i in range(n)]
    for k in range(0, n, 500):
        jobs.write_submits(items[k : k + 500])


@contextmanager
def _statements(cp: ControlPlane) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(cp.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(cp.engine, "before_cursor_execute", count)


def _steady_cycle_statements(cp: ControlPlane, loop: SchedulingLoop) -> int:
    loop.cycle()  # writes the new jobs' reasons
    with _statements(cp) as seen:
        result = loop.cycle()
    assert result.started == ()
    return len(seen)


def test_a_cycle_behind_a_deeper_queue_runs_no_more_sql_statements(cp: ControlPlane) -> None:
    loop = _loop(cp)
    _busy_pool(cp, loop)
    _queue(cp, 50)
    shallow = _steady_cycle_statements(cp, loop)
    _queue(cp, 450)
    deep = _steady_cycle_statements(cp, loop)
    # The old commit loaded every pending row again to compare its reason (one SELECT each).
    assert deep == shallow


def test_queued_specs_are_parsed_once_not_every_cycle(cp: ControlPlane) -> None:
    loop = _loop(cp)
    _busy_pool(cp, loop)
    _queue(cp, 300)
    loop.cycle()
    parsed = loop.specs.misses
    loop.cycle()
    loop.cycle()
    assert loop.specs.misses == parsed


def test_a_high_priority_job_behind_a_deep_queue_starts_in_the_next_cycle(
    cp: ControlPlane,
) -> None:
    loop = _loop(cp)
    _busy_pool(cp, loop)
    _queue(cp, 2000)
    loop.cycle()
    urgent = submit(cp, "urgent", gpus="0.1", priority="high")
    assert loop.cycle().started == (urgent.id,)
    detail = JobService(cp).get(ADMIN.principal, urgent.id)
    assert detail.job.state is JobState.CONFIGURING


def test_every_queued_job_gets_its_reason_and_a_changed_reason_is_rewritten(
    cp: ControlPlane,
) -> None:
    loop = _loop(cp)
    _busy_pool(cp, loop)
    _queue(cp, 30)
    loop.cycle()
    page = JobService(cp).list_jobs(
        ADMIN.principal, JobFilter(states=(JobState.PENDING,)), limit=1000
    )
    assert len(page.details) == 30
    assert all(
        d.pending_reason and d.pending_reason.startswith("InsufficientGpu") for d in page.details
    )
    held = page.details[0].job.id
    JobService(cp).set_held(ADMIN, held, True)
    loop.cycle()
    reason = JobService(cp).get(ADMIN.principal, held).pending_reason
    assert reason is not None
    assert not reason.startswith("InsufficientGpu")


def test_an_edited_queued_job_is_scheduled_with_its_new_spec(cp: ControlPlane) -> None:
    loop = _loop(cp)
    _busy_pool(cp, loop)
    job = submit(cp, "edit-me", gpus="1", time_limit="1h")
    loop.cycle()
    JobService(cp).update(ADMIN, job.id, {"time_limit": "2h", "preemptible": True})
    with cp.read() as s:
        snapshot, _ = build_snapshot(s, cp.now(), loop.specs)
    (seen,) = [j for j in snapshot.pending if j.id == job.id]
    assert seen.spec.time_limit_s == 7200
    assert seen.spec.preemptible
