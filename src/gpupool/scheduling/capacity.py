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
- a node's **model** is the model of most of its devices (ties: the first by index). Devices of
  another model on a mixed node are not usable (the arrays hold one model per node row); real
  clusters rarely mix models inside a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from gpupool.domain.nodes import DeviceHealth, allowed_model
from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.resources import ResourceRequest
from gpupool.scheduling.placement.base import BoolArray, CapacityArrays, Choice, IntArray, Shape
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica


def pool_view(base: CapacityArrays, usable: BoolArray) -> CapacityArrays:
    """A view of ``base`` restricted to ``usable`` slots; free-capacity arrays are shared."""
    view = CapacityArrays(
        node_names=base.node_names,
        model_names=base.model_names,
        node_model=base.node_model,
        free_milli=base.free_milli,
        free_mem=base.free_mem,
        total_mem=base.total_mem,
        usable=base.usable & usable,
        cpu_free=base.cpu_free,
        host_mem_free=base.host_mem_free,
        nvlink_group=base.nvlink_group,
        cpu_total=base.cpu_total,
        gpu_count=(base.usable & usable).sum(axis=1).astype(np.int64),
        physical_mem=base.physical_mem,
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
    views: dict[str, CapacityArrays] = field(default_factory=dict)
    _empty: CapacityArrays | None = None
    _models_cache: dict[tuple[str, ...], tuple[bool, ...] | None] = field(default_factory=dict)

    def view(self, pool: str) -> CapacityArrays:
        """The live view of ``pool`` (built on first use)."""
        found = self.views.get(pool)
        if found is None:
            found = pool_view(self.arrays, self.mask(pool))
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

    def models_mask(self, gpu_types: tuple[str, ...]) -> tuple[bool, ...] | None:
        """``Shape.models`` for a request's allowed GPU types (``None`` = any)."""
        if not gpu_types:
            return None
        found = self._models_cache.get(gpu_types, ())
        if found == ():
            found = tuple(allowed_model(m, gpu_types) for m in self.arrays.model_names)
            self._models_cache[gpu_types] = found
        return found

    def shape_of(self, request: ResourceRequest) -> Shape:
        """The integer shape of one replica of ``request``."""
        return Shape(
            milli=request.milli_per_device,
            count=request.device_count,
            memory_mib=request.gpu_memory_mib if request.device_count else None,
            cpu_milli=request.cpu_milli,
            host_memory_mib=request.host_memory_mib,
            models=self.models_mask(request.gpu_types) if request.device_count else None,
        )

    def held_by(self, replica: RunningReplica) -> tuple[Shape, Choice] | None:
        """What ``replica`` holds, as a shape and a choice (``None`` when its node is unknown)."""
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
        )
        return shape, Choice(row, tuple(slots))

    def uuids(self, choice: Choice) -> tuple[str, ...]:
        row = self.slot_uuid[choice.node]
        return tuple(str(row[s]) for s in choice.slots)


def _majority_model(models: Iterable[str]) -> str:
    counts = Counter(models)
    best = max(counts.values())
    return next(m for m in models if counts[m] == best)


def build_capacity(snapshot: ClusterSnapshot) -> ClusterCapacity:
    """Arrays of free capacity for ``snapshot`` (running replicas already subtracted)."""
    node_names = sorted({n.name for n in snapshot.nodes} | {d.node for d in snapshot.devices})
    node_row = {name: i for i, name in enumerate(node_names)}
    by_node: dict[str, list[int]] = {name: [] for name in node_names}
    devices = snapshot.devices
    for i, dev in enumerate(devices):
        by_node[dev.node].append(i)
    for idxs in by_node.values():
        idxs.sort(key=lambda i: (devices[i].index, devices[i].uuid))
    n = len(node_names)
    g = max((len(v) for v in by_node.values()), default=0)
    g = max(g, 1)

    node_model_name = [
        _majority_model([devices[i].model for i in by_node[name]]) if by_node[name] else ""
        for name in node_names
    ]
    model_names = tuple(sorted({m for m in node_model_name if m}))
    model_index = {m: i for i, m in enumerate(model_names)}
    overcommit = {p.name: p.memory_overcommit for p in snapshot.pools}

    physical = np.zeros((n, g), dtype=np.int64)
    total_mem = np.zeros((n, g), dtype=np.int64)
    usable = np.zeros((n, g), dtype=np.bool_)
    nvlink = np.full((n, g), -1, dtype=np.int64)
    slot_pool: list[list[str | None]] = [[None] * g for _ in range(n)]
    slot_uuid: list[list[str | None]] = [[None] * g for _ in range(n)]
    uuid_slot: dict[str, tuple[int, int]] = {}
    cpu = np.zeros(n, dtype=np.int64)
    host = np.zeros(n, dtype=np.int64)
    node_model = np.zeros(n, dtype=np.int64)
    schedulable = np.zeros(n, dtype=np.bool_)
    for name, row in node_row.items():
        node = snapshot.node_by_name.get(name)
        if node is not None:
            cpu[row] = node.cpu_milli
            host[row] = node.memory_mib
            schedulable[row] = node.schedulable
        node_model[row] = model_index.get(node_model_name[row], 0)
        for slot, i in enumerate(by_node[name]):
            dev = devices[i]
            physical[row, slot] = dev.memory_mib
            ratio = overcommit.get(dev.pool, 1.0)
            total_mem[row, slot] = int(dev.memory_mib * ratio)
            usable[row, slot] = (
                schedulable[row]
                and dev.health is DeviceHealth.HEALTHY
                and dev.model == node_model_name[row]
                and dev.pool in overcommit
            )
            if dev.nvlink_group is not None:
                nvlink[row, slot] = dev.nvlink_group
            slot_pool[row][slot] = dev.pool
            slot_uuid[row][slot] = dev.uuid
            uuid_slot[dev.uuid] = (row, slot)

    arrays = CapacityArrays(
        node_names=tuple(node_names),
        model_names=model_names or ("",),
        node_model=node_model,
        free_milli=np.where(physical > 0, 1000, 0).astype(np.int64),
        free_mem=total_mem.copy(),
        total_mem=total_mem,
        usable=usable,
        cpu_free=cpu.copy(),
        host_mem_free=host.copy(),
        nvlink_group=nvlink,
        cpu_total=cpu,
        gpu_count=usable.sum(axis=1).astype(np.int64),
        physical_mem=physical,
    )
    pool_masks: dict[str, BoolArray] = {}
    pool_nodes: dict[str, BoolArray] = {}
    pools_arr = np.array(slot_pool, dtype=object).reshape(n, g)
    for pool in snapshot.pool_by_name:
        mask: BoolArray = np.asarray(pools_arr == pool, dtype=np.bool_) & usable
        pool_masks[pool] = mask
        nodes: BoolArray = np.asarray(mask.any(axis=1), dtype=np.bool_)
        if pool == DEFAULT_POOL:
            # Nodes without any GPU take CPU-only jobs of the default pool.
            nodes = np.asarray(nodes | ((physical == 0).all(axis=1) & schedulable), dtype=np.bool_)
        pool_nodes[pool] = nodes
    cap = ClusterCapacity(
        arrays=arrays,
        slot_pool=tuple(tuple(r) for r in slot_pool),
        slot_uuid=tuple(tuple(r) for r in slot_uuid),
        uuid_slot=uuid_slot,
        node_row=node_row,
        pool_masks=pool_masks,
        pool_nodes=pool_nodes,
        host_total=host,
    )
    for replica in snapshot.running:
        held = cap.held_by(replica)
        if held is None:
            continue
        shape, choice = held
        # Subtract directly: what runs is a fact, even where it exceeds what we think exists.
        arrays.cpu_free[choice.node] -= shape.cpu_milli
        arrays.host_mem_free[choice.node] -= shape.host_memory_mib
        for s in choice.slots:
            arrays.free_milli[choice.node, s] -= shape.milli
            arrays.free_mem[choice.node, s] -= replica.memory_per_device_mib
    return cap
