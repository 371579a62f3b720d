"""Assignments: one replica of one job placed on one node, its states and why it stopped.

Words:

- **assignment**: the server's record of one replica of one attempt of a job on one node,
  with its slices. Its id is never reused; a restart is a new attempt with new assignments.
- **state** (:class:`AssignmentState`): where the replica is in its life, as the store holds it
  (``assignments.state``)::

      dispatched --> running --> finished
          |                         ^
          +-------------------------+

- **stop reason** (:class:`StopReason`): why the replica was (or is to be) stopped, as the
  store holds it (``assignments.stop_reason``). A reason set on a live assignment is a **stop
  order** the node's agent is sent; a reason on a finished one says why it ended. The first
  reason recorded wins: a replica cancelled and then lost with its node stays cancelled.
- **stop policy** (:class:`StopPolicy`): how a job wants its replicas stopped (the checkpoint
  signal, then the grace period before the kill), read from its spec.

The values of both enums are exactly the stored strings (no migration: the store keeps text).
The agent protocol has its own, smaller ``StopReason`` (:mod:`gpupool.schemas.agent`); the one
mapping between the two is ``WIRE_STOP_REASON`` in :mod:`gpupool.control.machinery.nodeorders`.

The one place an assignment changes state is :func:`gpupool.control.machinery.lifecycle`'s
``move_assignment`` (which calls :func:`check_move`) and its ``end_assignments``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpupool.domain.errors import GpupoolError
from gpupool.domain.jobs import JobSpec
from gpupool.domain.states import JobState


class AssignmentState(str, enum.Enum):
    """Where one replica is in its life (``assignments.state``)."""

    DISPATCHED = "dispatched"  # placed; its node has not reported it running yet
    RUNNING = "running"  # its node reported its processes running
    FINISHED = "finished"  # ended: its slices are free, its usage accrued

    def __str__(self) -> str:
        return self.value


class StopReason(str, enum.Enum):
    """Why a replica was stopped (``assignments.stop_reason``).

    Set by the server as an order: ``cancel`` (a user or admin), ``preempt`` (room for a job
    of higher priority, named in ``assignments.stop_for``), ``gang`` (a sibling replica of the
    same attempt ended badly: a gang lives and dies together). Reported by the agent: ``timeout``
    (the job's time limit), ``memory`` (the watchdog, over its memory slice), ``pressure``
    (the device ran short of memory and an opportunistic job was preempted), ``node`` (the
    agent's fence, or the server marking the node down), ``boot`` (it could not be started).
    """

    CANCEL = "cancel"
    PREEMPT = "preempt"
    TIMEOUT = "timeout"
    GANG = "gang"
    MEMORY = "memory"
    PRESSURE = "pressure"
    NODE = "node"
    BOOT = "boot"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: StopReason | str) -> StopReason:
        """The reason named by ``value`` (an enum member or its stored string)."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(r.value for r in cls)
            raise ValueError(f"{value!r} is not a stop reason: use one of {names}") from None


A = AssignmentState

#: Every legal move of an assignment, with why it exists. A move not listed here is an error.
ASSIGNMENT_TRANSITIONS: dict[tuple[AssignmentState, AssignmentState], str] = {
    (A.DISPATCHED, A.RUNNING): "its node reports the replica's processes running",
    (A.DISPATCHED, A.FINISHED): (
        "it ended before it was seen running: it failed to boot, exited between two reports, "
        "was stopped before its node took it, or its node was lost"
    ),
    (A.RUNNING, A.FINISHED): "its processes exited, or its node was lost",
}

del A

#: The terminal state of a job whose replica ended for this reason (``gang``: none of its own,
#: the sibling that ended first decides; the replica itself counts as failed).
STOP_OUTCOME: dict[StopReason, JobState] = {
    StopReason.CANCEL: JobState.CANCELLED,
    StopReason.PREEMPT: JobState.PREEMPTED,
    StopReason.TIMEOUT: JobState.TIMEOUT,
    StopReason.MEMORY: JobState.OUT_OF_MEMORY,
    StopReason.PRESSURE: JobState.PREEMPTED,
    StopReason.NODE: JobState.NODE_FAIL,
    StopReason.BOOT: JobState.BOOT_FAIL,
}

#: A replica that ended for one of these takes its gang down with it (as does a failed exit);
#: a cancel, a preemption or a time limit already applies to every replica of the job.
ENDS_THE_GANG: frozenset[StopReason] = frozenset(
    {StopReason.BOOT, StopReason.MEMORY, StopReason.PRESSURE, StopReason.NODE}
)


class InvalidAssignmentMove(GpupoolError):
    """An assignment state change that :data:`ASSIGNMENT_TRANSITIONS` does not allow."""

    def __init__(self, assignment_id: str, source: str, target: str) -> None:
        allowed = ", ".join(sorted(t.value for t in allowed_assignment_targets(source)))
        super().__init__(
            f"assignment {assignment_id} cannot go from {source} to {target}: that move is not "
            f"in the assignment state table (from {source}: {allowed or 'none, it is final'}); "
            "this is a bug in the server, report it with the server log"
        )
        self.assignment_id = assignment_id
        self.source = source
        self.target = target


def allowed_assignment_targets(state: AssignmentState | str) -> frozenset[AssignmentState]:
    """States an assignment in ``state`` may move to in one step."""
    return frozenset(dst for (src, dst) in ASSIGNMENT_TRANSITIONS if src.value == str(state))


def check_move(assignment_id: str, source: AssignmentState | str, target: AssignmentState) -> None:
    """Raise :class:`InvalidAssignmentMove` unless ``source -> target`` is in the table
    (``source`` may be the stored string; one that names no state is refused too)."""
    try:
        known = AssignmentState(source)
    except ValueError:
        raise InvalidAssignmentMove(assignment_id, str(source), target.value) from None
    if (known, target) not in ASSIGNMENT_TRANSITIONS:
        raise InvalidAssignmentMove(assignment_id, known.value, target.value)


@dataclass(frozen=True)
class StopPolicy:
    """How a job's replicas are stopped: ``signal`` first, then a kill after ``grace_s``
    seconds (0: the kill at once)."""

    signal: str = "SIGTERM"
    grace_s: float = 30.0

    @classmethod
    def of(cls, spec: JobSpec) -> StopPolicy:
        """The stop policy a job spec asks for (its checkpoint signal and grace period)."""
        return cls(spec.checkpoint_signal, float(spec.grace_period_s))


#: Replicas that must not run a moment longer (a stale agent's, a failed-over node's orphans).
KILL_AT_ONCE = StopPolicy("SIGKILL", 0.0)
