"""The life of an assignment in the store: the one way it moves, the one way it ends.

:func:`move_assignment` checks a move against the domain's table
(:data:`gpupool.domain.assignments.ASSIGNMENT_TRANSITIONS`) and stamps its time.

:func:`end_assignments` is how every path ends assignments: the exit report and the boot
failure (heartbeat), a node lost (:meth:`NodeService.mark_silent_nodes_down`), a replica stopped
before its node took it (heartbeat's unstarted ends), and so the end of a cancelled or
preempted replica, whose stop order was given by :func:`~.jobstate.stop_assignments`. In the
caller's transaction, for the assignments it is given:

1. **usage**: accrued up to now, then their slices released;
2. **finished**: each moves to ``finished`` with its exit code and signal, and keeps the first
   stop reason recorded (a server order wins over what the ending says: a replica cancelled and
   then lost with its node ended as a cancel);
3. **the gang**: when one ended badly (a failed exit with no stop order, or a reason in
   :data:`~gpupool.domain.assignments.ENDS_THE_GANG`), the live replicas of its attempt are
   ordered to stop (``gang``, with the job's stop policy) and **their nodes are rung**, so their
   agents' long polls wake once the transaction commits, not at their next heartbeat;
4. **the job**: once no replica of the attempt is live, and it is the job's current attempt,
   the attempt's outcome (:func:`~.jobstate.attempt_outcome`) finishes the job, which requeues
   where its policy says (:func:`~.jobstate.finish_job`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.machinery.jobstate import (
    attempt_outcome,
    finish_job,
    release_slices,
    stop_assignments,
)
from gpupool.control.machinery.nodeorders import stored_job
from gpupool.control.services.accounting import accrue
from gpupool.domain.assignments import ENDS_THE_GANG, AssignmentState, StopReason, check_move
from gpupool.store.models import AssignmentModel, JobModel, SliceModel


@dataclass(frozen=True)
class Ending:
    """How one assignment ended. ``exit_code`` / ``signal``: how its processes exited (``None``:
    not known, e.g. its node was lost); ``reason``: why it was stopped, when it was; ``message``:
    the job's reason should this ending decide its attempt (default ``attempt ended: STATE``)."""

    exit_code: int | None = None
    signal: str | None = None
    reason: StopReason | None = None
    message: str | None = None
    final: bool = False  # a boot failure no new attempt would escape: never requeued

    @property
    def clean(self) -> bool:
        """Its processes all exited 0."""
        return self.exit_code == 0 and self.signal is None


def move_assignment(a: AssignmentModel, target: AssignmentState, now: float) -> None:
    """Move ``a`` to ``target`` (``InvalidAssignmentMove`` if the table has no such edge)."""
    check_move(a.id, a.state, target)
    a.state = target.value
    if target is AssignmentState.RUNNING:
        a.started_at = now
    elif target is AssignmentState.FINISHED:
        a.ended_at = now


def _takes_the_gang_down(a: AssignmentModel, ending: Ending) -> bool:
    if a.stop_reason is None:
        return not ending.clean
    return StopReason.parse(a.stop_reason) in ENDS_THE_GANG


def end_assignments(
    session: Session, ended: Sequence[tuple[AssignmentModel, Ending]], now: float
) -> None:
    """End live assignments (see the module docstring for what that does, in order)."""
    if not ended:
        return
    ids = [a.id for a, _ in ended]
    accrue(
        session,
        list(
            session.scalars(
                select(SliceModel).where(
                    SliceModel.assignment_id.in_(ids), SliceModel.active.is_(True)
                )
            )
        ),
        now,
    )
    release_slices(session, ids)
    attempts: dict[tuple[str, int], list[tuple[AssignmentModel, Ending]]] = {}
    for a, ending in ended:
        move_assignment(a, AssignmentState.FINISHED, now)
        a.exit_code = ending.exit_code
        a.signal = ending.signal
        if a.stop_reason is None and ending.reason is not None:
            a.stop_reason = ending.reason.value
        attempts.setdefault((a.job_id, a.attempt), []).append((a, ending))
    session.flush()
    for (job_id, attempt), mine in attempts.items():
        _after_ending(session, job_id, attempt, mine, now)


def _after_ending(
    session: Session,
    job_id: str,
    attempt: int,
    mine: list[tuple[AssignmentModel, Ending]],
    now: float,
) -> None:
    """Steps 3 and 4 for one attempt whose replicas ``mine`` just ended."""
    job = session.get(JobModel, job_id)
    if job is None:
        return
    replicas = list(
        session.scalars(
            select(AssignmentModel).where(
                AssignmentModel.job_id == job_id, AssignmentModel.attempt == attempt
            )
        )
    )
    live = [x for x in replicas if x.state != AssignmentState.FINISHED.value]
    if live:
        if any(_takes_the_gang_down(a, e) for a, e in mine):  # a gang lives and dies together
            stop_assignments(session, live, StopReason.GANG, stored_job(job).stop_policy)
        return
    if job.restart_count != attempt:
        return  # a late end of an older attempt: the job has moved on
    outcome, code, sig = attempt_outcome(replicas)
    message = next((e.message for _, e in reversed(mine) if e.message), None)
    finish_job(
        session,
        job,
        outcome,
        now,
        reason=message or f"attempt ended: {outcome.value}",
        exit_code=code,
        signal=sig,
        requeue=not any(e.final for _, e in mine),
    )
