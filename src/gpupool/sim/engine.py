"""The discrete-event core: a heap of ``(time, seq, event)`` and the manual clock it moves.

Words:

- **event**: something that happens at one instant of simulated time (:class:`Event`): a job
  arrives, a job's work is done, a preempted job has stopped, a node fails or comes back, or
  the control loop's periodic tick comes round.
- **batch**: every event of one instant. The replay handles a whole batch, then runs one
  scheduling cycle, as a real control loop does on its tick; :meth:`EventQueue.pop_batch` hands
  them over together.
- **seq**: a counter that breaks ties between events of the same instant, so events come out
  in the order they were pushed and a run is reproducible to the event.
- **attempt**: a job's run number (0 for its first start, +1 after each requeue). A finish event
  carries the attempt it belongs to, so the finish of a run that was preempted is recognised as
  stale and ignored instead of being removed from the heap.

Within one instant, events come out by ``kind`` first (:class:`EventKind` order: finishes free
capacity before arrivals ask for it), then by ``seq``.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass

from gpupool.control.machinery.clock import ManualClock


class EventKind(enum.IntEnum):
    """What happened. The value orders events of the same instant."""

    FINISH = 0  # a job's remaining work reached zero
    STOPPED = 1  # a preempted job's grace period is over: its slices are free
    NODE_DOWN = 2  # a node failed: its jobs are lost back to their last checkpoint
    NODE_UP = 3  # a failed node is back
    ARRIVAL = 4  # a job is submitted
    TICK = 5  # the control loop's periodic tick: a cycle even when nothing else happened
    CYCLE = 6  # a coalesced scheduling cycle is due (with a minimum cycle interval)


@dataclass(frozen=True)
class Event:
    """One event. ``subject`` is a job id (finish, stopped, arrival) or a node name."""

    kind: EventKind
    subject: str
    attempt: int = 0


class EventQueue:
    """Future events, earliest first, and the clock that follows them.

    The clock is a :class:`~gpupool.control.machinery.clock.ManualClock`; popping a batch sets it
    to the batch's time, so code that reads the clock sees simulated time.
    """

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock if clock is not None else ManualClock(0.0)
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self.pushed = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, event: Event) -> None:
        """Schedule ``event`` at ``time`` (not before the clock: the past cannot change)."""
        now = self.clock.now()
        if time < now:
            raise ValueError(f"event {event} at {time} is before the current time {now}")
        heapq.heappush(self._heap, (time, int(event.kind), self._seq, event))
        self._seq += 1
        self.pushed += 1

    def peek_time(self) -> float | None:
        """Time of the next event, or ``None`` when nothing is left."""
        return self._heap[0][0] if self._heap else None

    def pop_batch(self) -> tuple[float, list[Event]]:
        """Every event at the earliest time, in order; moves the clock there."""
        if not self._heap:
            raise IndexError("no events left")
        time = self._heap[0][0]
        batch: list[Event] = []
        while self._heap and self._heap[0][0] == time:
            batch.append(heapq.heappop(self._heap)[3])
        self.clock.set(time)
        return time, batch
