"""Stage 5, reservation and backfill, and start-time estimates.

Words:

- **timeline**: the pool's free capacity as running jobs end, in order of their expected end
  (a replica's ``expected_end``; a stopping replica ends after its grace period; unknown ends
  come last and make every time after them unknown). :class:`Timeline` keeps copies of the
  arrays at a few checkpoints and steps between them, so "when does this fit?" costs a handful
  of feasibility checks, not one per running job.
- **reservation**: the first job of a pool that cannot start (and is not waiting for victims or
  quota) is promised its earliest start ``T`` on the timeline and the devices it would get then.
  The arrays at ``T`` with that job placed are the **shadow**.
- **backfill**: a later job may start now only if it does not delay the reserved job: either it is
  expected to end by ``T`` (``now`` + expected duration, else time limit), or it also fits in the
  shadow (it is then placed where both the present and the shadow have room, and kept in the
  shadow). A job with no expected duration and no time limit is never "ending by ``T``".

Stages: ``easy`` (EASY backfill, above), ``strict`` (nothing starts behind the first blocked job
of its pool) and ``greedy`` (no reservation: start whatever fits; big jobs may starve).

Estimated start of a blocked job: the earliest time on the timeline at which it would fit if it
were first in line (a lower bound: jobs ahead of it are not counted), ``None`` when that needs a
job with an unknown end to finish, or when it never fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import ClassVar, Protocol

import numpy as np

from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.capacity import ClusterCapacity
from gpupool.scheduling.decision import Reservation
from gpupool.scheduling.fit import Placed, allocate_all, place_job, release_all
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    PlacementPolicy,
    Shape,
)
from gpupool.scheduling.release import Release
from gpupool.scheduling.snapshot import RunningReplica

_CHECKPOINTS = 16


_ORDER = attrgetter("order")


class _Amounts:
    """The releases' amounts as flat arrays, so a run of consecutive releases is given back
    in a few numpy calls instead of one :meth:`CapacityArrays.release` per release.

    ``offsets[i]`` is where release ``i``'s slots start in the per-slot arrays. Amounts are
    integers, added exactly: the arrays end as they would after releasing one by one.
    """

    def __init__(self, arrays: CapacityArrays, releases: list[Release]) -> None:
        shapes = [r.shape for r in releases]
        choices = [r.choice for r in releases]
        counts = np.asarray([len(c.slots) for c in choices], dtype=np.intp)
        self.nodes = np.asarray([c.node for c in choices], dtype=np.intp)
        self.cpu = np.asarray([s.cpu_milli for s in shapes], dtype=np.int64)
        self.host = np.asarray([s.host_memory_mib for s in shapes], dtype=np.int64)
        self.rows = np.repeat(self.nodes, counts)
        self.cols = np.fromiter(
            chain.from_iterable(c.slots for c in choices), dtype=np.intp, count=int(counts.sum())
        )
        self.milli = np.repeat(np.asarray([s.milli for s in shapes], dtype=np.int64), counts)
        fixed = [s.memory_mib for s in shapes]
        if None in fixed:
            # A proportional request takes its share of each slot's physical memory.
            proportional = np.repeat(np.asarray([m is None for m in fixed]), counts)
            need = arrays.physical_mem[self.rows, self.cols] * self.milli // MILLI_PER_GPU
            given = np.repeat(np.asarray([m or 0 for m in fixed], dtype=np.int64), counts)
            self.mem = np.where(proportional, need, given).astype(np.int64)
        else:
            self.mem = np.repeat(np.asarray(fixed, dtype=np.int64), counts)
        self.offsets: list[int] = [0, *np.cumsum(counts).tolist()]

    def release(self, arrays: CapacityArrays, lo: int, hi: int) -> None:
        """Give back releases ``lo`` to ``hi`` (exclusive) on ``arrays``."""
        if hi <= lo:
            return
        np.add.at(arrays.cpu_free, self.nodes[lo:hi], self.cpu[lo:hi])
        np.add.at(arrays.host_mem_free, self.nodes[lo:hi], self.host[lo:hi])
        a, b = self.offsets[lo], self.offsets[hi]
        if b > a:
            where = (self.rows[a:b], self.cols[a:b])
            np.add.at(arrays.free_milli, where, self.milli[a:b])
            np.add.at(arrays.free_mem, where, self.mem[a:b])


class Timeline:
    """Free capacity of one pool over time (see the module docstring)."""

    def __init__(self, live: CapacityArrays, releases: list[Release], now: float) -> None:
        self.now = now
        self.releases = sorted(releases, key=_ORDER)
        self._amounts = _Amounts(live, self.releases)
        self._checkpoints: list[tuple[int, CapacityArrays]] = []
        work = live.copy()
        total = len(self.releases)
        marks = sorted({int(k) for k in np.linspace(0, total, min(total, _CHECKPOINTS) + 1)})
        done = 0
        for mark in marks:
            self._amounts.release(work, done, mark)
            done = mark
            self._checkpoints.append((mark, work.copy()))
        later = [r.time for r in self.releases if r.time is not None and r.time > now]
        #: The first moment after ``now`` at which a running job is expected to end.
        self.next_end: float | None = min(later) if later else None

    def earliest(
        self, fits: Callable[[CapacityArrays], bool]
    ) -> tuple[float | None, CapacityArrays] | None:
        """The first time at which ``fits`` holds, and the arrays then (a copy), or ``None``.

        ``fits`` must be monotone: more free capacity never makes it false.
        """
        first = next((i for i, (_, arr) in enumerate(self._checkpoints) if fits(arr)), None)
        if first is None:
            return None
        if first == 0:
            return self.now, self._checkpoints[0][1].copy()
        lo, arrays = self._checkpoints[first - 1]
        hi = self._checkpoints[first][0]
        # Binary search for the fewest releases after which it fits: ``work`` holds the state
        # after ``lo`` releases (does not fit); the state after ``hi`` releases fits.
        work = arrays.copy()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial = work.copy()
            self._amounts.release(trial, lo, mid)
            if fits(trial):
                hi = mid
            else:
                lo, work = mid, trial
        self._amounts.release(work, lo, hi)
        last = self.releases[hi - 1]
        k = hi
        # Everything that ends at the same moment is free then too.
        while (
            k < len(self.releases) and last.time is not None and self.releases[k].time == last.time
        ):
            k += 1
        self._amounts.release(work, hi, k)
        return (None if last.time is None else max(last.time, self.now)), work

    def estimate(self, fits: Callable[[CapacityArrays], bool]) -> float | None:
        found = self.earliest(fits)
        return None if found is None else found[0]


def running_releases(
    capacity: ClusterCapacity,
    running_by_job: Mapping[str, tuple[RunningReplica, ...]],
    taken: Set[str],
    now: float,
) -> list[Release]:
    """A release for each running replica, except those of jobs in ``taken`` (victims chosen
    this cycle) and those on nodes the capacity does not know.

    A stopping replica (``stopping``) ends after its grace period from ``now``; any other at
    its ``expected_end``. The latter depends only on the replica and the layout, so it is
    remembered per replica object (``LayoutMemo.releases``, like the slots in ``held``).
    """
    releases: list[Release] = []
    append, held_by = releases.append, capacity.held_by
    memo = capacity.memo.releases
    get = memo.get
    for job_id, replicas in running_by_job.items():
        if job_id in taken:
            continue
        for r in replicas:
            stopping = r.stopping
            if not stopping:
                entry = get(id(r))
                if entry is not None and entry[0] is r:
                    append(entry[1])
                    continue
            held = held_by(r)
            if held is None:
                continue
            release = Release(now + r.grace_period_s if stopping else r.expected_end, *held)
            if not stopping:
                memo[id(r)] = (r, release)
            append(release)
    return releases


def fits_check(
    policy: PlacementPolicy, shape: Shape, replicas: int, nodes: BoolArray
) -> Callable[[CapacityArrays], bool]:
    """A monotone "does the job place here?" test for :meth:`Timeline.earliest`."""

    def check(arrays: CapacityArrays) -> bool:
        if replicas == 1:
            return bool((arrays.feasible_nodes(shape) & nodes).any())
        placed = place_job(arrays, policy, shape, replicas, nodes)
        if placed is None:
            return False
        release_all(arrays, placed)
        return True

    return check


def intersect(live: CapacityArrays, shadow: CapacityArrays) -> CapacityArrays:
    """Arrays with, everywhere, the smaller of the free amounts of ``live`` and ``shadow``."""
    both = CapacityArrays(
        node_names=live.node_names,
        model_names=live.model_names,
        node_model=live.node_model,
        free_milli=np.minimum(live.free_milli, shadow.free_milli),
        free_mem=np.minimum(live.free_mem, shadow.free_mem),
        total_mem=live.total_mem,
        usable=live.usable,
        cpu_free=np.minimum(live.cpu_free, shadow.cpu_free),
        host_mem_free=np.minimum(live.host_mem_free, shadow.host_mem_free),
        nvlink_group=live.nvlink_group,
        cpu_total=live.cpu_total,
        gpu_count=live.gpu_count,
        physical_mem=live.physical_mem,
        slot_model=live.slot_model,
        context_mem=live.context_mem,
        auto_context_mem=live.auto_context_mem,
    )
    both.share_cache(live)
    return both


@dataclass(frozen=True)
class Gate:
    """What a job must satisfy to start now: ``open`` False = it may not; ``shadow`` set = it
    must also fit there."""

    open: bool = True
    shadow: CapacityArrays | None = None


OPEN = Gate()
CLOSED = Gate(open=False)


@dataclass
class Blocked:
    """A blocked job the backfill stage may reserve for."""

    job_id: str
    pool: str
    shape: Shape
    replicas: int
    nodes: BoolArray
    policy: PlacementPolicy
    timeline: Callable[[], Timeline]


class PoolBackfill(Protocol):
    """The backfill state of one pool during one cycle."""

    reservation: Reservation | None

    @property
    def closes_all(self) -> bool:
        """True when :meth:`gate` is closed for every job from now on in this cycle."""
        ...

    def gate(self, end: float | None) -> Gate:
        """May a job that is expected to end at ``end`` (``None`` = unknown) start now?"""
        ...

    def started(self, placed: tuple[Placed, ...], end: float | None) -> None:
        """A job started at ``placed``; keep the shadow up to date."""
        ...

    def blocked(self, job: Blocked) -> Reservation | None:
        """A job could not start; return the reservation made for it, if any."""
        ...


class BackfillStage(Protocol):
    name: ClassVar[str]

    def open(self, pool: str, now: float) -> PoolBackfill: ...


@dataclass
class EasyPool:
    """EASY backfill for one pool."""

    now: float
    reservation: Reservation | None = None
    shadow: CapacityArrays | None = None
    strict: bool = False
    _blocked_seen: bool = field(default=False)

    @property
    def closes_all(self) -> bool:
        """Strict order after a blocked job: no later job may start, whatever its end."""
        return self.strict and self._blocked_seen

    def gate(self, end: float | None) -> Gate:
        if self.strict and self._blocked_seen:
            return CLOSED
        if self.reservation is None or self.shadow is None:
            return OPEN
        start = self.reservation.start_time
        if start is not None and end is not None and end <= start:
            return OPEN
        return Gate(shadow=self.shadow)

    def started(self, placed: tuple[Placed, ...], end: float | None) -> None:
        if self.reservation is None or self.shadow is None:
            return
        start = self.reservation.start_time
        if start is not None and end is not None and end <= start:
            return
        allocate_all(self.shadow, placed)

    def blocked(self, job: Blocked) -> Reservation | None:
        if self.reservation is not None:
            return None
        self._blocked_seen = True
        timeline = job.timeline()
        found = timeline.earliest(fits_check(job.policy, job.shape, job.replicas, job.nodes))
        if found is None:
            return None
        start, arrays = found
        placed = place_job(arrays, job.policy, job.shape, job.replicas, job.nodes)
        if placed is None:  # pragma: no cover - fits_check just said it places
            return None
        nodes = tuple(sorted({arrays.node_names[p.choice.node] for p in placed}))
        self.reservation = Reservation(job.job_id, job.pool, start, nodes)
        self.shadow = arrays
        return self.reservation


class Easy:
    name: ClassVar[str] = "easy"

    def open(self, pool: str, now: float) -> PoolBackfill:
        return EasyPool(now)


class Strict:
    name: ClassVar[str] = "strict"

    def open(self, pool: str, now: float) -> PoolBackfill:
        return EasyPool(now, strict=True)


@dataclass
class GreedyPool:
    reservation: Reservation | None = None
    closes_all: bool = False

    def gate(self, end: float | None) -> Gate:
        return OPEN

    def started(self, placed: tuple[Placed, ...], end: float | None) -> None:
        return None

    def blocked(self, job: Blocked) -> Reservation | None:
        return None


class Greedy:
    name: ClassVar[str] = "greedy"

    def open(self, pool: str, now: float) -> PoolBackfill:
        return GreedyPool()


#: name -> backfill stage.
BACKFILLS: dict[str, type[BackfillStage]] = {
    "easy": Easy,
    "greedy": Greedy,
    "strict": Strict,
}


def make_backfill(name: str) -> BackfillStage:
    """The backfill stage registered as ``name``."""
    found = BACKFILLS.get(name)
    if found is None:
        raise InvalidValue(
            f"backfill {name!r} is not known: use one of {', '.join(sorted(BACKFILLS))}",
            field="backfill",
        )
    return found()
