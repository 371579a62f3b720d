"""Free capacity of a snapshot as numpy arrays, built once per cycle and updated in place.

:func:`build_capacity` turns a :class:`~gpupool.scheduling.snapshot.ClusterSnapshot` into a
:class:`ClusterCapacity`: one cluster-wide :class:`CapacityArrays` (node rows sorted by name,
slots in device-index order) with the running replicas already subtracted, plus one *view* per
pool. A view shares the cluster's free-capacity arrays (so an allocation made through one pool's
view is seen by every pool: CPUs and host memory belong to the node, not to a pool) and has its
own ``usable`` mask: the healthy devices of that pool on schedulable nodes.

Words:

- **row** / **slot**: a node's row and a device's column in the arrays.
- **promisable memory** of a device: physical memory times its pool's ``memory_overcommit``,
  rounded down; ``free_mem`` starts there and running replicas' promised memory is subtracted.
- a slot's **model** is its device's (``slot_model``); a node may mix models and every healthy
  device of every model is usable. A node's ``node_model`` is the model of most of its devices
  (ties: the first by index), for per-node heuristics only (see
  :mod:`gpupool.scheduling.placement.base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from gpupool.domain.nodes import allowed_model, is_mig_model
from gpupool.domain.resources import ResourceRequest
from gpupool.scheduling.memo import Amounts, LayoutMemo, SchedulerMemo
from gpupool.scheduling.placement.base import (
    BoolArray,
    CapacityArrays,
    Choice,
    IntArray,
    Shape,
    context_of,
)
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica


def pool_view(
    base: CapacityArrays, usable: BoolArray, gpu_count: IntArray | None = None
) -> CapacityArrays:
    """A view of ``base`` restricted to ``usable`` slots; free-capacity arrays are shared.

    ``gpu_count`` may pass the view's usable slots per node when already known (a layout
    keeps it per pool); otherwise it is counted here.
    """
    mask = base.usable & usable
    view = CapacityArrays(
        node_names=base.node_names,
        model_names=base.model_names,
        node_model=base.node_model,
        free_milli=base.free_milli,
        free_mem=base.free_mem,
        total_mem=base.total_mem,
        usable=mask,
        cpu_free=base.cpu_free,
        host_mem_free=base.host_mem_free,
        nvlink_group=base.nvlink_group,
        cpu_total=base.cpu_total,
        gpu_count=mask.sum(axis=1).astype(np.int64) if gpu_count is None else gpu_count,
        physical_mem=base.physical_mem,
        slot_model=base.slot_model,
        context_mem=base.context_mem,
        auto_context_mem=base.auto_context_mem,
    )
    view.share_cache(base)
    return view


@dataclass
class ClusterCapacity:
    """The cluster's arrays, the per-pool views and the maps between names and rows/slots."""

    arrays: CapacityArrays
    slot_pool: tuple[tuple[str | None, ...], ...]  # [N][G] pool of the device in each slot
    slot_uuid: tuple[tuple[str | None, ...], ...]  # [N][G] device UUID in each slot
    uuid_slot: dict[str, tuple[int, int]]
    node_row: dict[str, int]
    pool_masks: dict[str, BoolArray]  # pool -> [N, G] usable slots of the pool
    pool_nodes: dict[str, BoolArray]  # pool -> [N] nodes with a usable device of the pool
    host_total: IntArray  # [N] host memory of each node, MiB
    # The layout these arrays were built from and what is remembered with it (the caller's,
    # or a fresh one that lives for this cycle only): see gpupool.scheduling.memo.
    memo: LayoutMemo
    views: dict[str, CapacityArrays] = field(default_factory=dict)
    _empty: CapacityArrays | None = None
    _models_cache: dict[tuple[str, ...], tuple[bool, ...] | None] = field(default_factory=dict)

    def view(self, pool: str) -> CapacityArrays:
        """The live view of ``pool`` (built on first use)."""
        found = self.views.get(pool)
        if found is None:
            counts = self.memo.layout.pool_gpu_count.get(pool)
            found = pool_view(self.arrays, self.mask(pool), counts)
            self.views[pool] = found
        return found

    def empty_view(self, pool: str) -> CapacityArrays:
        """``pool`` as if nothing ran (for "would it ever fit?" questions)."""
        if self._empty is None:
            base = self.arrays.copy()
            base.free_milli[:] = np.where(base.physical_mem > 0, 1000, 0)
            base.free_mem[:] = base.total_mem
            base.cpu_free[:] = base.cpu_total
            base.host_mem_free[:] = self.host_total
            self._empty = base
        return pool_view(self._empty, self.mask(pool))

    def mask(self, pool: str) -> BoolArray:
        found = self.pool_masks.get(pool)
        if found is None:
            found = np.zeros_like(self.arrays.usable)
            self.pool_masks[pool] = found
        return found

    def nodes_of(self, pool: str) -> BoolArray:
        found = self.pool_nodes.get(pool)
        if found is None:
            found = np.zeros(self.arrays.num_nodes, dtype=np.bool_)
            self.pool_nodes[pool] = found
        return found

    def models_mask(
        self, gpu_types: tuple[str, ...], *, several: bool = False
    ) -> tuple[bool, ...] | None:
        """``Shape.models`` for a request's allowed GPU types (``None`` = any).

        ``several``: the replica needs more than one device, so MIG instances are out (CUDA
        gives a process one MIG instance, however many it is shown).
        """
        if several and not any(is_mig_model(m) for m in self.arrays.model_names):
            several = False  # no MIG here: the same mask as for one device
        if not gpu_types and not several:
            return None
        key = (*gpu_types, "\0several") if several else gpu_types
        found = self._models_cache.get(key, ())
        if found == ():
            found = tuple(
                allowed_model(m, gpu_types) and not (several and is_mig_model(m))
                for m in self.arrays.model_names
            )
            self._models_cache[key] = found
        return found

    def shape_of(self, request: ResourceRequest, isolation: str = "auto") -> Shape:
        """The integer shape of one replica of ``request`` under ``isolation`` (the mode the
        job asks for: it says where the replica's context lies)."""
        return Shape(
            milli=request.milli_per_device,
            count=request.device_count,
            memory_mib=request.gpu_memory_mib if request.device_count else None,
            cpu_milli=request.cpu_milli,
            host_memory_mib=request.host_memory_mib,
            models=(
                self.models_mask(request.gpu_types, several=request.device_count > 1)
                if request.device_count
                else None
            ),
            context=context_of(isolation, request.milli_per_device, request.device_count),
        )

    def shape_for(self, request: ResourceRequest, isolation: str = "auto") -> Shape:
        """:meth:`shape_of`, remembered per request object (``LayoutMemo.shapes``, an identity
        entry: used only for that very object, and for the same isolation)."""
        shapes = self.memo.shapes
        entry = shapes.get(id(request))
        if entry is not None and entry[0] is request and entry[1] == isolation:
            return entry[2]
        shape = self.shape_of(request, isolation)
        shapes[id(request)] = (request, isolation, shape)
        return shape

    def held_by(self, replica: RunningReplica) -> tuple[Shape, Choice] | None:
        """What ``replica`` holds, as a shape and a choice (``None`` when its node is unknown).

        Remembered per replica object (``LayoutMemo.held``), so a replica that runs for many
        cycles is resolved once. An entry keeps its replica and is used only for that very
        object (``is``), so a reused id can never return another replica's slots; the answer
        depends only on the replica and the layout the memo goes with.
        """
        held = self.memo.held
        entry = held.get(id(replica))
        if entry is not None and entry[0] is replica:
            return entry[1]
        found = self._held_by(replica)
        amounts = None
        if found is not None:
            shape, choice = found
            amounts = (
                choice.node,
                shape.cpu_milli,
                shape.host_memory_mib,
                shape.count,
                shape.milli,
                shape.memory_mib or 0,
                choice.slots,
            )
        held[id(replica)] = (replica, found, amounts)
        return found

    def _held_by(self, replica: RunningReplica) -> tuple[Shape, Choice] | None:
        row = self.node_row.get(replica.node)
        if row is None:
            return None
        slots = []
        for uuid in replica.devices:
            where = self.uuid_slot.get(uuid)
            if where is None or where[0] != row:
                return None
            slots.append(where[1])
        shape = Shape(
            milli=replica.milli_per_device,
            count=len(slots),
            memory_mib=replica.memory_per_device_mib,
            cpu_milli=replica.cpu_milli,
            host_memory_mib=replica.host_memory_mib,
            context=context_of(replica.isolation, replica.milli_per_device, len(slots)),
        )
        choice = Choice(row, tuple(slots))
        # One plain amount per slot: its slice and, where its context lies outside, the headroom.
        return self.arrays.held_shape(shape, choice), choice

    def uuids(self, choice: Choice) -> tuple[str, ...]:
        row = self.slot_uuid[choice.node]
        return tuple(str(row[s]) for s in choice.slots)


def build_capacity(snapshot: ClusterSnapshot, memo: SchedulerMemo | None = None) -> ClusterCapacity:
    """Arrays of free capacity for ``snapshot`` (running replicas already subtracted).

    The static part is the layout ``memo`` remembers for the snapshot's nodes, devices and
    pools (built when it has none; ``memo=None``: a fresh memo for this call only, the same
    arrays). This copies its "nothing runs" free arrays and subtracts the running replicas
    in a few vectorised steps.
    """
    found = (SchedulerMemo() if memo is None else memo).layout_for(snapshot)
    layout = found.layout
    arrays = CapacityArrays(
        node_names=layout.node_names,
        model_names=layout.model_names,
        node_model=layout.node_model,
        free_milli=layout.free_milli.copy(),
        free_mem=layout.total_mem.copy(),
        total_mem=layout.total_mem,
        usable=layout.usable,
        cpu_free=layout.cpu_total.copy(),
        host_mem_free=layout.host_total.copy(),
        nvlink_group=layout.nvlink_group,
        cpu_total=layout.cpu_total,
        gpu_count=layout.gpu_count,
        physical_mem=layout.physical_mem,
        slot_model=layout.slot_model,
        context_mem=layout.context_mem,
        auto_context_mem=layout.auto_context_mem,
    )
    arrays._proportional = found.proportional  # physical_mem is the layout's: same results
    cap = ClusterCapacity(
        arrays=arrays,
        slot_pool=layout.slot_pool,
        slot_uuid=layout.slot_uuid,
        uuid_slot=layout.uuid_slot,
        node_row=layout.node_row,
        pool_masks=dict(layout.pool_masks),
        pool_nodes=dict(layout.pool_nodes),
        host_total=layout.host_total,
        memo=found,
    )
    if snapshot.running:
        _subtract_running(cap, snapshot.running, layout.width)
    return cap


def _subtract_running(
    cap: ClusterCapacity, running: tuple[RunningReplica, ...], width: int
) -> None:
    """Take what ``running`` holds off ``cap``'s free arrays.

    What runs is a fact, even where it exceeds what we think exists, so nothing is checked
    against the free capacity (free amounts may go negative). One pass in Python gathers the
    per-replica amounts; numpy adds them up per node (``bincount``) and per slot.
    """
    taken: list[Amounts] = []
    memo = cap.memo.held
    for replica in running:
        entry = memo.get(id(replica))
        if entry is None or entry[0] is not replica:
            cap.held_by(replica)
            entry = memo[id(replica)]
        if entry[2] is not None:
            taken.append(entry[2])
    if not taken:
        return
    rows, cpus, hosts, counts, milli, mem, slot_tuples = zip(*taken, strict=True)
    slots = list(chain.from_iterable(slot_tuples))
    a = cap.arrays
    n = a.num_nodes
    row_arr = np.asarray(rows, dtype=np.int64)
    a.cpu_free -= np.bincount(row_arr, weights=cpus, minlength=n).astype(np.int64)
    a.host_mem_free -= np.bincount(row_arr, weights=hosts, minlength=n).astype(np.int64)
    if slots:
        reps = np.asarray(counts, dtype=np.int64)
        flat = np.repeat(row_arr, reps) * width + np.asarray(slots, dtype=np.int64)
        size = n * width
        taken_milli = np.bincount(flat, weights=np.repeat(milli, reps), minlength=size)
        taken_mem = np.bincount(flat, weights=np.repeat(mem, reps), minlength=size)
        a.free_milli -= taken_milli.astype(np.int64).reshape(n, width)
        a.free_mem -= taken_mem.astype(np.int64).reshape(n, width)
