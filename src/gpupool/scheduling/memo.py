"""What the scheduler remembers from one cycle to the next: one :class:`SchedulerMemo`.

``schedule(snapshot, config, memo)`` decides from ``snapshot`` and ``config`` alone; the memo
only saves work that an earlier cycle already did, and a cycle gives the same decision with a
warm memo, a cold one or none. It is owned by the caller that runs cycles one after another:
the scheduling loop keeps one for as long as it runs (``SchedulingLoop.memo``), a replay one
per replay (``Replay.memo``). ``memo=None`` means "remember nothing": that one call gets a fresh
memo of its own, which it drops when it returns. Nothing in ``gpupool.scheduling`` keeps state
at module level, so two callers with two memos (two replays in two threads, a loop and a
replay in one process) cannot see each other's entries. A memo has no lock: it belongs to one
caller, which runs one cycle at a time with it.

Words:

- **layout**: the static part of a cluster's capacity arrays (:class:`~.layout.CapacityLayout`),
  built from a **layout key**, the ``(nodes, devices, pools)`` tuples of a snapshot.
- **identity entry**: a value remembered for one *object* (a running replica, a resource
  request), not for whatever compares equal to it. The dict is keyed by ``id(obj)`` and the
  entry keeps ``obj`` as its first item: a hit is used only when that item ``is`` the object
  looked up, and since the entry holds a strong reference the id cannot be reused by another
  object while the entry lives. An entry hits in a later cycle only when the caller's
  snapshots share the object: the replay keeps its running replicas and queued jobs from cycle
  to cycle, the live loop its queued jobs' specs (``SpecCache``) but not its running replicas,
  which it reads afresh each cycle (their entries then only save work within the cycle, and
  are trimmed as below). An equal but new object just misses. Identity rather than equality,
  because hashing a frozen dataclass field by field for every running replica of every cycle
  costs more than the memo saves.

What is remembered, and when each part stops being used:

======================== ================================ ========================================
part                     remembers                        valid while
======================== ================================ ========================================
``SchedulerMemo``        the :data:`LAYOUT_MEMO_SIZE`     a snapshot's key tuples are the same
                         most recently used layouts, each objects as an entry's, or compare equal
                         with its key tuples and its      to them (``Node``, ``Device`` and
                         :class:`LayoutMemo`              ``Pool`` are frozen and compared by
                                                          value): any change to a node, device or
                                                          pool (a device unhealthy, a node
                                                          cordoned, an overcommit changed) misses
                                                          and builds a new layout with an empty
                                                          :class:`LayoutMemo`; the least recently
                                                          used entry goes when the memo is full
``LayoutMemo.held``      per running replica: the slots   its layout (entries depend only on the
                         it holds and the amounts it      replica object and the layout)
                         takes (``ClusterCapacity.
                         held_by``)
``LayoutMemo.releases``  per running replica that is not  its layout (``expected_end`` is part of
                         stopping: its timeline release   the replica; a stopping one ends at
                         (``running_releases``)           ``now`` + its grace, so is never kept)
``LayoutMemo.shapes``    per resource request: its        its layout (the shape's model mask
                         integer shape under its job's    depends on the layout's models), and
                         isolation (``ClusterCapacity     the same isolation (it says where the
                         .shape_for``)                    replica's CUDA context lies)
``LayoutMemo.            per milli share: the ``[N, G]``  its layout (physical memory is static)
proportional``           memory a proportional request
                         of that share needs
======================== ================================ ========================================

Nothing has to be invalidated by hand. What goes stale is only what no longer runs or waits:
:meth:`SchedulerMemo.layout_for` drops the identity entries of replicas that stopped running
once ``held`` and ``releases`` hold more than four per running replica plus twice ``slack``,
and those of requests no longer queued once ``shapes`` holds more than two per pending job plus
``slack``, so a memo stays about the size of the running set and the queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.domain.jobs import Job
from gpupool.domain.nodes import Device, Node
from gpupool.domain.pools import Pool
from gpupool.domain.resources import ResourceRequest
from gpupool.scheduling.layout import CapacityLayout, build_layout
from gpupool.scheduling.placement.base import Choice, IntArray, Shape
from gpupool.scheduling.release import Release
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica

#: Layouts a memo keeps (a cluster changes little from one cycle to the next; a few entries let
#: a node flapping between two states reuse both layouts).
LAYOUT_MEMO_SIZE = 4

#: Identity entries allowed beyond the running set (or the queue) before stale ones are dropped.
MEMO_SLACK = 4096

#: What a running replica takes off the free arrays: (row, milli-CPU, host MiB, GPUs, milli per
#: GPU, MiB per GPU, slots).
Amounts = tuple[int, int, int, int, int, int, tuple[int, ...]]

#: ``held`` entry: the replica, what it holds (``None``: its node or one of its devices is not
#: in the layout) and what it takes (``None`` likewise).
HeldEntry = tuple[RunningReplica, "tuple[Shape, Choice] | None", "Amounts | None"]

#: ``releases`` entry: the replica and its timeline release.
ReleaseEntry = tuple[RunningReplica, "Release"]

#: ``shapes`` entry: the request, the isolation its job asks for and the integer shape of one of
#: its replicas.
ShapeEntry = tuple[ResourceRequest, str, Shape]


@dataclass(eq=False)
class LayoutMemo:
    """One layout, the key it was built from, and what is remembered with it.

    The identity entries (``held``, ``releases``, ``shapes``) are keyed by ``id`` of their
    first item; see the module docstring. ``proportional`` is handed to the cycle's capacity
    arrays (``CapacityArrays._proportional``), which fill it.
    """

    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]
    pools: tuple[Pool, ...]
    layout: CapacityLayout
    held: dict[int, HeldEntry] = field(default_factory=dict)
    releases: dict[int, ReleaseEntry] = field(default_factory=dict)
    shapes: dict[int, ShapeEntry] = field(default_factory=dict)
    proportional: dict[int, IntArray] = field(default_factory=dict)

    def matches(
        self, nodes: tuple[Node, ...], devices: tuple[Device, ...], pools: tuple[Pool, ...]
    ) -> bool:
        """Is this the layout of ``nodes``/``devices``/``pools`` (same objects or equal)?"""
        return (
            _same(self.devices, devices) and _same(self.nodes, nodes) and _same(self.pools, pools)
        )

    def trim(
        self, running: tuple[RunningReplica, ...], pending: tuple[Job, ...], slack: int
    ) -> None:
        """Drop the entries of replicas and requests gone from the snapshot, once there are
        clearly more entries than running replicas (or queued jobs)."""
        if len(self.held) + len(self.releases) > 4 * len(running) + 2 * slack:
            keep = {id(r) for r in running}
            for memo in (self.held, self.releases):
                for key in [k for k in memo if k not in keep]:
                    del memo[key]
        if len(self.shapes) > 2 * len(pending) + slack:
            keep = {id(job.spec.resources) for job in pending}
            for key in [k for k in self.shapes if k not in keep]:
                del self.shapes[key]


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return a is b or (len(a) == len(b) and a == b)


@dataclass(eq=False)
class SchedulerMemo:
    """What one caller's cycles remember (see the module docstring); pass it to every cycle.

    ``size`` is how many layouts it keeps, ``slack`` how far the identity entries may grow past
    the running set and the queue before stale ones are dropped.
    """

    size: int = LAYOUT_MEMO_SIZE
    slack: int = MEMO_SLACK
    # Most recently used last.
    _layouts: list[LayoutMemo] = field(default_factory=list, repr=False)

    def layout_for(self, snapshot: ClusterSnapshot) -> LayoutMemo:
        """The layout of ``snapshot`` with its memo: remembered when a matching one is here,
        else built (and the least recently used one dropped when full); trimmed to the
        snapshot's running replicas and queue."""
        nodes, devices, pools = snapshot.nodes, snapshot.devices, snapshot.pools
        layouts = self._layouts
        found: LayoutMemo | None = None
        for i in range(len(layouts) - 1, -1, -1):
            if layouts[i].matches(nodes, devices, pools):
                found = layouts[i]
                if i != len(layouts) - 1:
                    layouts.append(layouts.pop(i))
                break
        if found is None:
            found = LayoutMemo(nodes, devices, pools, build_layout(nodes, devices, pools))
            layouts.append(found)
            del layouts[: max(0, len(layouts) - max(self.size, 1))]
        found.trim(snapshot.running, snapshot.pending, self.slack)
        return found

    @property
    def layouts(self) -> tuple[LayoutMemo, ...]:
        """The layouts remembered, least recently used first (for tests and diagnostics)."""
        return tuple(self._layouts)

    def clear(self) -> None:
        """Forget everything (the next cycle builds its layout afresh)."""
        self._layouts.clear()


__all__ = [
    "LAYOUT_MEMO_SIZE",
    "MEMO_SLACK",
    "Amounts",
    "HeldEntry",
    "LayoutMemo",
    "ReleaseEntry",
    "SchedulerMemo",
    "ShapeEntry",
]
