"""Applying job state changes to the store, and deciding how a finished attempt ended.

Every change goes through :func:`move`: it calls the domain's ``transition()``, copies the new
job onto its row (the row's version column makes the UPDATE conditional on the version read)
and adds the job event, all in the caller's transaction.

Words:

- **attempt**: the assignments created for one start of a job (one per replica). A restart is
  a new attempt with new assignment ids.
- **outcome**: the terminal state an attempt ends in, decided by :func:`attempt_outcome` from
  why it was stopped (:data:`gpupool.domain.assignments.STOP_OUTCOME`) and how its processes
  exited.

Stop orders are given by :func:`stop_assignments` (which rings the nodes concerned);
assignments move and end in :mod:`gpupool.control.machinery.lifecycle`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpupool.control.machinery.orders import mark
from gpupool.control.notify import note
from gpupool.domain.assignments import STOP_OUTCOME, AssignmentState, StopPolicy, StopReason
from gpupool.domain.jobs import Job
from gpupool.domain.states import JobState
from gpupool.domain.transitions import should_requeue, transition
from gpupool.store.mapping import apply_job, event_to_row, job_from_row
from gpupool.store.models import AssignmentModel, JobModel, SliceModel

#: When several replicas ended differently, the job takes the most severe outcome.
_SEVERITY = (
    JobState.NODE_FAIL,
    JobState.CANCELLED,
    JobState.PREEMPTED,
    JobState.TIMEOUT,
    JobState.OUT_OF_MEMORY,
    JobState.BOOT_FAIL,
    JobState.FAILED,
    JobState.COMPLETED,
)


def move(
    session: Session,
    row: JobModel,
    target: JobState,
    now: float,
    *,
    reason: str | None = None,
    exit_code: int | None = None,
    signal: str | None = None,
) -> Job:
    """Transition the job in ``row`` to ``target``; raises ``InvalidTransition`` if illegal."""
    job = job_from_row(row)
    new, event = transition(job, target, now=now, reason=reason, exit_code=exit_code, signal=signal)
    apply_job(row, new)
    if target is not JobState.PENDING:
        row.pending_reason = None
    session.add(event_to_row(event))
    note(session, new)  # --mail-type: told after the commit (gpupool.control.notify)
    return new


def requeue_if_allowed(session: Session, row: JobModel, now: float) -> bool:
    """After a terminal state: back to the queue when the job's requeue policy says so."""
    job = job_from_row(row)
    if not should_requeue(job):
        return False
    move(session, row, JobState.REQUEUED, now, reason=f"requeued after {job.state.value}")
    move(session, row, JobState.PENDING, now, reason="waiting again")
    return True


def attempt_outcome(assignments: list[AssignmentModel]) -> tuple[JobState, int | None, str | None]:
    """The outcome of a finished attempt, with the exit code and signal to record."""
    outcomes: list[tuple[JobState, int | None, str | None]] = []
    for a in assignments:
        reason = StopReason.parse(a.stop_reason) if a.stop_reason is not None else None
        if reason is not None and reason in STOP_OUTCOME:
            outcomes.append((STOP_OUTCOME[reason], a.exit_code, a.signal))
        elif a.exit_code == 0 and a.signal is None:
            outcomes.append((JobState.COMPLETED, 0, None))
        else:
            outcomes.append((JobState.FAILED, a.exit_code, a.signal))
    return min(outcomes, key=lambda o: _SEVERITY.index(o[0]))


def finish_job(
    session: Session,
    row: JobModel,
    outcome: JobState,
    now: float,
    *,
    requeue: bool = True,
    **kw: object,
) -> None:
    """Move a job whose attempt ended to ``outcome`` (through RUNNING/COMPLETING as needed);
    ``requeue`` False: never back to the queue (a boot failure every attempt would meet)."""
    state = JobState(row.state)
    if state.is_terminal or state in (JobState.PENDING, JobState.REQUEUED):
        return  # already decided (e.g. cancelled while launching)
    if state is JobState.CONFIGURING and outcome not in (
        JobState.BOOT_FAIL,
        JobState.CANCELLED,
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
    ):
        move(session, row, JobState.RUNNING, now, reason="started and ended between reports")
    move(session, row, outcome, now, **kw)  # type: ignore[arg-type]
    if requeue:
        requeue_if_allowed(session, row, now)


def release_slices(session: Session, assignment_ids: list[str]) -> None:
    if assignment_ids:
        session.execute(
            update(SliceModel)
            .where(SliceModel.assignment_id.in_(assignment_ids), SliceModel.active.is_(True))
            .values(active=False)
        )


def stop_assignments(
    session: Session,
    rows: Iterable[AssignmentModel],
    reason: StopReason,
    policy: StopPolicy,
    *,
    for_job: str | None = None,
) -> list[str]:
    """Give each live assignment in ``rows`` that has no stop order yet the order ``reason``
    (signal and grace from ``policy``; ``for_job``: the job a preemption makes room for), and
    ring the nodes of all of them (:func:`~.orders.mark`), so their agents' long polls wake
    after the commit. Returns the ids of ``rows``."""
    rows = [a for a in rows if a.state != AssignmentState.FINISHED.value]
    for a in rows:
        if a.stop_reason is None:
            a.stop_reason = reason.value
            a.stop_signal = policy.signal
            a.stop_grace_s = policy.grace_s
            a.stop_for = for_job
    mark(session, (a.node for a in rows))
    return [a.id for a in rows]


def order_stop(
    session: Session,
    job_id: str,
    reason: StopReason | str,
    signal: str,
    grace_s: float,
    *,
    for_job: str | None = None,
) -> list[str]:
    """Set a stop order on every live assignment of a job; returns their ids. ``reason`` is a
    :class:`~gpupool.domain.assignments.StopReason` or its stored string; ``for_job`` names
    the job a preemption makes room for (kept on the assignment for the next snapshots)."""
    rows = session.scalars(
        select(AssignmentModel).where(
            AssignmentModel.job_id == job_id,
            AssignmentModel.state != AssignmentState.FINISHED.value,
        )
    )
    return stop_assignments(
        session, rows, StopReason.parse(reason), StopPolicy(signal, grace_s), for_job=for_job
    )
