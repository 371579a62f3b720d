"""Job states, with Slurm's names and short codes, and the one table of legal moves.

The lifecycle of a job::

    PENDING --> CONFIGURING --> RUNNING --> COMPLETING --> COMPLETED | FAILED | CANCELLED | ...
       ^                                                      |
       +-------------------- REQUEUED <-- PREEMPTED / NODE_FAIL / FAILED (when requeue allows)

A job leaves the queue only through :func:`gpupool.domain.transitions.transition`, which checks
this table, writes an event and bumps the job's version.
"""

from __future__ import annotations

import enum


class JobState(enum.Enum):
    """A job's state. ``code`` is Slurm's compact code (``squeue -o %t``)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    REQUEUED = "REQUEUED"

    @property
    def code(self) -> str:
        return _CODES[self]

    @property
    def is_terminal(self) -> bool:
        """No edge leaves a terminal state except the requeue edges from PREEMPTED and friends."""
        return self in TERMINAL_STATES

    @property
    def holds_resources(self) -> bool:
        """True while the job's slices are allocated on devices."""
        return self in ACTIVE_STATES

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Accept a name (``running``) or a Slurm code (``R``), case-insensitively."""
        upper = text.strip().upper()
        for state in cls:
            if upper in (state.value, state.code.upper()):
                return state
        names = ", ".join(f"{s.value} ({s.code})" for s in cls)
        raise ValueError(f"{text!r} is not a job state: use one of {names}")


_CODES: dict[JobState, str] = {
    JobState.PENDING: "PD",
    JobState.CONFIGURING: "CF",
    JobState.RUNNING: "R",
    JobState.COMPLETING: "CG",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.CANCELLED: "CA",
    JobState.TIMEOUT: "TO",
    JobState.PREEMPTED: "PR",
    JobState.NODE_FAIL: "NF",
    JobState.OUT_OF_MEMORY: "OOM",
    JobState.BOOT_FAIL: "BF",
    JobState.REQUEUED: "RQ",
}

ACTIVE_STATES = frozenset({JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING})
TERMINAL_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
        JobState.BOOT_FAIL,
    }
)

S = JobState

#: Every legal move, with why it exists. A move not listed here is an error.
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    # -- from the queue
    (S.PENDING, S.CONFIGURING): "the scheduler gave the job its slices; the agent is launching it",
    (S.PENDING, S.CANCELLED): "the user or an admin cancelled a job that never started",
    # -- launching
    (S.CONFIGURING, S.RUNNING): "the agent reports the job's processes started",
    (S.CONFIGURING, S.BOOT_FAIL): "the agent could not start it (missing program, bad workdir)",
    (S.CONFIGURING, S.CANCELLED): "cancelled while the agent was launching it",
    (S.CONFIGURING, S.PREEMPTED): "a higher-priority job took the slice before it started",
    (S.CONFIGURING, S.NODE_FAIL): "its node went down before the job started",
    # -- running
    (S.RUNNING, S.COMPLETING): "a stop was ordered (cancel, preemption, time limit); grace runs",
    (S.RUNNING, S.COMPLETED): "every process exited with code 0",
    (S.RUNNING, S.FAILED): "a process exited non-zero or was killed by a signal",
    (S.RUNNING, S.CANCELLED): "the agent killed it on a cancel before any grace was needed",
    (S.RUNNING, S.TIMEOUT): "it ran past its time limit and the agent stopped it",
    (S.RUNNING, S.PREEMPTED): "the agent stopped it under GPU memory pressure",
    (S.RUNNING, S.NODE_FAIL): "its node stopped heart-beating past the timeout",
    (S.RUNNING, S.BOOT_FAIL): "a gang replica could not be started while its siblings ran",
    (S.RUNNING, S.OUT_OF_MEMORY): "it exceeded its GPU memory slice and the watchdog stopped it",
    # -- stopping
    (S.COMPLETING, S.COMPLETED): "it exited 0 during its grace period",
    (S.COMPLETING, S.FAILED): "it exited non-zero while stopping for a reason other than below",
    (S.COMPLETING, S.CANCELLED): "the stop was a cancel and the processes are gone",
    (S.COMPLETING, S.TIMEOUT): "the stop was its time limit and the processes are gone",
    (S.COMPLETING, S.PREEMPTED): "the stop was a preemption and the processes are gone",
    (S.COMPLETING, S.NODE_FAIL): "its node went down while it was stopping",
    (S.COMPLETING, S.OUT_OF_MEMORY): "the stop was the memory watchdog and the processes are gone",
    # -- back to the queue
    (S.PREEMPTED, S.REQUEUED): "its requeue policy brings a preempted job back",
    (S.NODE_FAIL, S.REQUEUED): "its requeue policy brings a job lost with its node back",
    (S.BOOT_FAIL, S.REQUEUED): "a launch failure may be the node's fault: try elsewhere",
    (S.FAILED, S.REQUEUED): "policy on-failure: a failed job is retried up to max_restarts",
    (S.REQUEUED, S.PENDING): "the requeued job waits again, restart count incremented",
    (S.REQUEUED, S.CANCELLED): "cancelled between requeue and queue",
}

del S


def allowed_targets(state: JobState) -> frozenset[JobState]:
    """States reachable from ``state`` in one move."""
    return frozenset(dst for (src, dst) in TRANSITIONS if src is state)


def is_allowed(source: JobState, target: JobState) -> bool:
    return (source, target) in TRANSITIONS
