"""The job state table and the one transition() that enforces it."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.domain.errors import InvalidTransition
from gpupool.domain.jobs import Job, JobSpec, RequeuePolicy
from gpupool.domain.states import TERMINAL_STATES, TRANSITIONS, JobState, allowed_targets
from gpupool.domain.transitions import should_requeue, transition


def make_job(state: JobState = JobState.PENDING, **spec_changes: object) -> Job:
    spec = JobSpec(name="j", command=("true",), **spec_changes)  # type: ignore[arg-type]
    job = Job(id="j1", spec=spec, tenant="t", user="u", priority=500)
    if state is JobState.PENDING:
        return job
    # Walk the shortest path through the table to reach ``state``.
    path = _path_to(state)
    for target in path:
        job, _ = transition(job, target, now=1.0)
    return job


def _path_to(goal: JobState) -> list[JobState]:
    parents: dict[JobState, JobState | None] = {JobState.PENDING: None}
    queue = deque([JobState.PENDING])
    while queue:
        state = queue.popleft()
        for nxt in sorted(allowed_targets(state), key=lambda s: s.value):
            if nxt not in parents:
                parents[nxt] = state
                queue.append(nxt)
    path: list[JobState] = []
    node: JobState | None = goal
    while node is not None and node is not JobState.PENDING:
        path.append(node)
        node = parents[node]
    return list(reversed(path))


def test_every_state_is_reachable_from_pending() -> None:
    seen = {JobState.PENDING}
    queue = deque([JobState.PENDING])
    while queue:
        for nxt in allowed_targets(queue.popleft()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    assert seen == set(JobState)


def test_every_edge_has_a_reason() -> None:
    assert all(why.strip() for why in TRANSITIONS.values())


def test_slurm_codes_are_unique_and_known() -> None:
    codes = {s.code for s in JobState}
    assert len(codes) == len(JobState)
    assert JobState.PENDING.code == "PD"
    assert JobState.RUNNING.code == "R"
    assert JobState.COMPLETING.code == "CG"
    assert JobState.COMPLETED.code == "CD"
    assert JobState.OUT_OF_MEMORY.code == "OOM"


def test_parse_accepts_names_and_codes() -> None:
    assert JobState.parse("running") is JobState.RUNNING
    assert JobState.parse("PD") is JobState.PENDING
    assert JobState.parse("cd") is JobState.COMPLETED
    with pytest.raises(ValueError, match="not a job state"):
        JobState.parse("sleeping")


ALL_PAIRS = [(a, b) for a in JobState for b in JobState]
ILLEGAL = [(a, b) for (a, b) in ALL_PAIRS if (a, b) not in TRANSITIONS]


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=lambda s: s.value)
def test_every_illegal_transition_is_rejected(source: JobState, target: JobState) -> None:
    job = make_job(source)
    assert job.state is source
    with pytest.raises(InvalidTransition) as info:
        transition(job, target, now=2.0)
    assert source.value in str(info.value)
    assert target.value in str(info.value)


@pytest.mark.parametrize(("source", "target"), list(TRANSITIONS), ids=lambda s: s.value)
def test_every_legal_transition_bumps_version_and_records_an_event(
    source: JobState, target: JobState
) -> None:
    job = make_job(source)
    new, event = transition(job, target, now=5.0, reason="why")
    assert new.state is target
    assert new.version == job.version + 1
    assert (event.source, event.target, event.version) == (source, target, new.version)
    assert event.time == 5.0
    assert event.reason == "why"
    assert job.state is source  # the old value is untouched


def test_terminal_states_only_lead_back_to_the_queue() -> None:
    for state in TERMINAL_STATES:
        assert allowed_targets(state) <= {JobState.REQUEUED}


def test_running_sets_start_and_terminal_sets_end() -> None:
    job = make_job()
    job, _ = transition(job, JobState.CONFIGURING, now=1.0)
    job, _ = transition(job, JobState.RUNNING, now=2.0)
    assert job.start_time == 2.0
    job, _ = transition(job, JobState.COMPLETED, now=9.0, exit_code=0)
    assert (job.end_time, job.exit_code) == (9.0, 0)


def test_requeue_back_to_pending_counts_a_restart_and_clears_the_attempt() -> None:
    job = make_job(JobState.RUNNING)
    job, _ = transition(job, JobState.PREEMPTED, now=3.0, signal="SIGTERM")
    assert should_requeue(job)
    job, _ = transition(job, JobState.REQUEUED, now=3.0)
    job, _ = transition(job, JobState.PENDING, now=4.0)
    assert job.restart_count == 1
    assert job.eligible_time == 4.0
    assert (job.start_time, job.end_time, job.signal) == (None, None, None)


def test_requeue_policy() -> None:
    failed = make_job(JobState.FAILED)
    assert not should_requeue(failed)
    assert should_requeue(make_job(JobState.FAILED, requeue=RequeuePolicy.ON_FAILURE))
    assert not should_requeue(make_job(JobState.PREEMPTED, requeue=RequeuePolicy.NEVER))
    assert not should_requeue(make_job(JobState.COMPLETED, requeue=RequeuePolicy.ON_FAILURE))
    exhausted = make_job(JobState.PREEMPTED, max_restarts=0)
    assert not should_requeue(exhausted)


def test_with_changes_refuses_state() -> None:
    with pytest.raises(ValueError, match="transition"):
        make_job().with_changes(state=JobState.RUNNING)


@given(st.lists(st.sampled_from(list(JobState)), max_size=30))
def test_random_walks_only_ever_take_table_edges(targets: list[JobState]) -> None:
    job = make_job()
    for target in targets:
        before = job
        try:
            job, _ = transition(job, target, now=1.0)
        except InvalidTransition:
            assert (before.state, target) not in TRANSITIONS
            assert job is before
        else:
            assert (before.state, target) in TRANSITIONS
            assert job.version == before.version + 1
