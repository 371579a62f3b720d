"""Applying a scheduling :class:`~gpupool.scheduling.decision.Decision`, once, for every caller.

The scheduler decides; this module holds the rules for carrying a decision out, and both the
live server and the simulator go through it, so a replay exercises the server's rules. The
state it changes sits behind a small port (:class:`DecisionTarget`) with two adapters:

- the store (:class:`gpupool.control.machinery.apply_store.StoreTarget`): job rows, assignments
  and slices, stop orders, the nodes to ring, in the loop's commit transaction;
- in-memory state (:class:`gpupool.sim.replay.Replay`): the replay's queue, running replicas and
  device counters.

The rules, in the order they are applied (:func:`apply_decision`):

1. **starts**, in the decision's order. A start is refused (``skipped``) when its job is no
   longer pending as the snapshot read it (cancelled, held or edited since) or when a device it
   names no longer has the milli-GPU and memory it needs (:func:`room_left`; the room may have
   gone since the snapshot). A refused job simply waits for the next cycle.
2. **preemptions**, in the decision's order, after the starts (a preemptor never starts in the
   cycle that chose its victims: it waits for them to stop). What happens depends on the
   victim's state (:class:`VictimState`): a running victim is told to stop with its grace
   period; a victim still starting (placed, not yet running) is stopped at once and requeued; a
   victim already stopping, or gone, is left alone (it is **not** stopped again). Every stop
   keeps the id of the job it makes room for (``for_job``), so the next snapshots show the
   victim as stopping *for* that job and later cycles wait for it instead of choosing more
   victims.
3. **pending information**: each job left waiting gets its reason and estimated start
   (:meth:`DecisionTarget.note_pending`; the store writes only what changed since the snapshot,
   :func:`changed_pending`). Reservations live there: the reserved job's estimate is its
   reserved start and the jobs that would delay it wait with ``WaitingForReservation``. A
   reservation holds no state of its own between cycles; each cycle computes it afresh from the
   snapshot, so there is nothing else to apply.

Words:

- **changed** (:attr:`Applied.changed`): the cycle started a job or ordered a stop, so the cluster
  will not look the same to the next cycle; a cycle that only refreshed reasons changed nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.decision import Decision, PendingInfo, Preemption, Start


class VictimState(enum.Enum):
    """What a preemption finds its victim doing, which decides what is done to it."""

    RUNNING = "running"  # stop it, with its grace period
    STARTING = "starting"  # placed but not running yet: stop it at once and requeue it
    STOPPING = "stopping"  # already stopping or ended: leave it alone


@dataclass(frozen=True)
class Room:
    """What one device can still take: milli-GPU and memory (MiB, after the pool's overcommit)."""

    milli: int
    memory_mib: int


class DecisionTarget(Protocol):
    """The state a decision changes. Adapters do what they are told; the rules are above."""

    def still_pending(self, start: Start) -> bool:
        """The start's job is pending exactly as the snapshot read it (not cancelled, held or
        changed since)."""
        ...

    def free_room(self, uuids: Iterable[str]) -> Mapping[str, Room]:
        """What each device of ``uuids`` can still take now; a device that is gone is left
        out."""
        ...

    def start(self, start: Start) -> None:
        """Place every replica of the job (a gang whole) and move it out of the queue."""
        ...

    def victim_state(self, job_id: str) -> VictimState:
        """What the victim ``job_id`` is doing now (``STOPPING`` for a job that is gone)."""
        ...

    def stop(self, preemption: Preemption, *, at_once: bool, reason: str) -> None:
        """Order every replica of ``preemption.victim`` to stop, keeping ``preemption.for_job``
        with the stop. ``at_once``: the victim had not started running; it ends now and is
        requeued when its policy allows. Otherwise it stops within its grace period.
        ``reason`` is the sentence to record on the job."""
        ...

    def note_pending(self, pending: Mapping[str, PendingInfo]) -> None:
        """Record why each waiting job waits and its estimated start (may do nothing)."""
        ...


@dataclass(frozen=True)
class Applied:
    """What applying one decision did: jobs started, starts refused, victims told to stop."""

    started: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """A job started or a stop was ordered (see the module's words)."""
        return bool(self.started or self.preempted)


def device_needs(start: Start) -> dict[str, Room]:
    """The milli-GPU and memory each device of ``start`` must have free (a device used by two
    replicas of the job counts both)."""
    need: dict[str, Room] = {}
    for r in start.replicas:
        for uuid in r.devices:
            had = need.get(uuid)
            need[uuid] = (
                Room(r.milli_per_device, r.memory_per_device_mib)
                if had is None
                else Room(had.milli + r.milli_per_device, had.memory_mib + r.memory_per_device_mib)
            )
    return need


def room_left(start: Start, target: DecisionTarget) -> bool:
    """Every device of ``start`` still exists and has the milli and memory it needs."""
    need = device_needs(start)
    free = target.free_room(need)
    for uuid, want in need.items():
        room = free.get(uuid)
        if room is None or want.milli > room.milli or want.memory_mib > room.memory_mib:
            return False
    return True


def device_room(
    capacity_mib: int, overcommit: float, used_milli: int, used_memory_mib: int
) -> Room:
    """What a device of ``capacity_mib`` (its pool overcommitting memory by ``overcommit``)
    still has with ``used_milli`` and ``used_memory_mib`` taken; one rule for both adapters."""
    return Room(MILLI_PER_GPU - used_milli, int(capacity_mib * overcommit) - used_memory_mib)


def preemption_reason(preemption: Preemption) -> str:
    """The sentence recorded on a victim: names the job it makes room for and why."""
    return f"preempted for job {preemption.for_job}: {preemption.message}"


def apply_decision(decision: Decision, target: DecisionTarget) -> Applied:
    """Carry ``decision`` out on ``target`` by the rules of this module; returns what was done."""
    started: list[str] = []
    skipped: list[str] = []
    for start in decision.starts:
        if not target.still_pending(start) or not room_left(start, target):
            skipped.append(start.job_id)
            continue
        target.start(start)
        started.append(start.job_id)
    preempted: list[str] = []
    for p in decision.preemptions:
        state = target.victim_state(p.victim)
        if state is VictimState.STOPPING:
            continue  # stopping already (for this job or another reason): not stopped twice
        target.stop(p, at_once=state is VictimState.STARTING, reason=preemption_reason(p))
        preempted.append(p.victim)
    target.note_pending(decision.pending)
    return Applied(tuple(started), tuple(skipped), tuple(preempted))


class StoredPending(Protocol):
    """What the snapshot read of a waiting job's stored reason and estimate (the store's
    :class:`~gpupool.control.machinery.snapshot.PendingRead`)."""

    @property
    def pending_reason(self) -> str | None: ...

    @property
    def estimated_start(self) -> float | None: ...


_Read = TypeVar("_Read", bound=StoredPending)


def pending_text(info: PendingInfo) -> str:
    """How a pending reason is stored and shown: ``Reason: sentence``."""
    return f"{info.reason.value}: {info.message}"


def changed_pending(
    pending: Mapping[str, PendingInfo], reads: Mapping[str, _Read]
) -> list[tuple[str, _Read, str, float | None]]:
    """The waiting jobs whose reason or estimate differs from what the snapshot read, with
    what was read, the new reason text and the new estimate. A job the snapshot did not read
    pending is left out."""
    out: list[tuple[str, _Read, str, float | None]] = []
    for job_id, info in pending.items():
        read = reads.get(job_id)
        if read is None:
            continue
        text = pending_text(info)
        if text != read.pending_reason or info.estimated_start != read.estimated_start:
            out.append((job_id, read, text, info.estimated_start))
    return out
