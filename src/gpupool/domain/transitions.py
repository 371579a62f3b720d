"""The one place a job changes state.

:func:`transition` validates the move against :data:`gpupool.domain.states.TRANSITIONS`,
returns the new job (version + 1, times updated) and the :class:`JobEvent` that the store must
write with it, in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpupool.domain.errors import InvalidTransition
from gpupool.domain.jobs import Job, RequeuePolicy
from gpupool.domain.states import ACTIVE_STATES, JobState, is_allowed


@dataclass(frozen=True)
class JobEvent:
    """One recorded state change. ``version`` is the job's version after the change."""

    job_id: str
    time: float
    source: JobState
    target: JobState
    version: int
    reason: str | None = None


def transition(
    job: Job,
    target: JobState,
    *,
    now: float,
    reason: str | None = None,
    exit_code: int | None = None,
    signal: str | None = None,
) -> tuple[Job, JobEvent]:
    """Move ``job`` to ``target`` at time ``now``; raise ``InvalidTransition`` if not allowed."""
    if not is_allowed(job.state, target):
        raise InvalidTransition(job.id, job.state.value, target.value)
    changes: dict[str, object] = {
        "state": target,
        "version": job.version + 1,
        "reason": reason,
    }
    if target is JobState.RUNNING:
        changes["start_time"] = now
    if target.is_terminal:
        changes["end_time"] = now
    if exit_code is not None:
        changes["exit_code"] = exit_code
    if signal is not None:
        changes["signal"] = signal
    if target is JobState.PENDING:  # back from REQUEUED: a fresh attempt
        changes.update(
            restart_count=job.restart_count + 1,
            eligible_time=now,
            start_time=None,
            end_time=None,
            exit_code=None,
            signal=None,
            isolation=None,
        )
    new = replace(job, **changes)  # type: ignore[arg-type]
    event = JobEvent(job.id, now, job.state, target, new.version, reason)
    return new, event


def should_requeue(job: Job) -> bool:
    """Whether a job that just reached a terminal state goes back to the queue.

    Depends on the spec's requeue policy and ``max_restarts`` (restarts so far < max).
    """
    policy = job.spec.requeue
    if policy is RequeuePolicy.NEVER or job.restart_count >= job.spec.max_restarts:
        return False
    if job.state in (JobState.PREEMPTED, JobState.NODE_FAIL, JobState.BOOT_FAIL):
        return True
    return job.state is JobState.FAILED and policy is RequeuePolicy.ON_FAILURE


def holds_resources(state: JobState) -> bool:
    return state in ACTIVE_STATES
