"""The static layout of a cluster's capacity arrays, built once and reused across cycles.

A scheduling cycle needs the cluster as numpy arrays (see :mod:`gpupool.scheduling.capacity`).
Most of that picture does not change from one cycle to the next: which node is which row,
which device is which slot, the models, physical and promisable memory, NVLink groups and
which slots each pool may use. Only what *runs* changes. :class:`CapacityLayout` holds the
part that depends on ``nodes``, ``devices`` and ``pools`` alone; the caller's memo keeps
it from cycle to cycle, so a cycle only copies the "nothing runs" free arrays and subtracts the
running replicas.

Words:

- **layout**: a :class:`CapacityLayout`; every array in it is read-only (``writeable`` is
  off), so a cycle that tried to change it in place would fail loudly instead of corrupting
  the next cycle.
- **layout key**: the ``(nodes, devices, pools)`` tuples of a snapshot.

**Context headroom** (see :mod:`gpupool.scheduling.placement.base`): ``context_mem`` holds each
device's context reserve, what one process holds there beyond its slice as the node measured
and registered it (``Device.context_reserve_mib``; :data:`DEFAULT_CONTEXT_RESERVE_MIB` for a
device whose agent did not say, an agent older than the field). ``auto_context_mem`` is the
same where a sharing replica under isolation ``auto`` would get a mode that leaves its context
outside the slice: on a MIG instance (mode ``mig``), or on a node that does not offer the shim
(``mps`` or ``soft``); a node offering it gives ``mps+shim`` or ``shim``, which charge the
context inside the slice. A node that never registered its modes (``Node.isolation_modes``
``None``: a simulated cluster) is taken to offer the shim.

A layout is built by :func:`build_layout` and depends on nothing else: a snapshot with the
same key gives the same layout. Which layouts are kept across cycles, and what is remembered
with each (the slots of running replicas, their timeline releases, the shapes of requests), is
the caller's :class:`~gpupool.scheduling.memo.SchedulerMemo`; this module keeps no state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.domain.nodes import Device, DeviceHealth, Node
from gpupool.domain.pools import DEFAULT_POOL, Pool
from gpupool.scheduling.placement.base import BoolArray, IntArray

#: MiB assumed for a device whose agent reported no context reserve: a Hopper context with
#: cuBLAS/cuDNN workspaces (the agent's own fallback, gpupool.gpu.context, is 640 + 128 MiB).
DEFAULT_CONTEXT_RESERVE_MIB = 768


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class CapacityLayout:
    """What the capacity arrays of a cluster are when nothing runs, and the maps into them.

    Arrays are ``[N]`` per node row or ``[N, G]`` per (row, slot), all read-only.
    ``pool_masks`` are a pool's usable slots and ``pool_gpu_count`` how many of them each
    node has. ``slot_flat`` maps a device UUID to ``row * G + slot``.
    """

    node_names: tuple[str, ...]
    model_names: tuple[str, ...]
    node_model: IntArray  # the majority model of each node (per-node heuristics only)
    slot_model: IntArray  # [N, G] the model of each slot's device, -1 on padding
    free_milli: IntArray  # 1000 on every real device, 0 on padding
    total_mem: IntArray
    physical_mem: IntArray
    usable: BoolArray
    nvlink_group: IntArray
    context_mem: IntArray
    auto_context_mem: IntArray
    cpu_total: IntArray
    host_total: IntArray
    gpu_count: IntArray
    slot_pool: tuple[tuple[str | None, ...], ...]
    slot_uuid: tuple[tuple[str | None, ...], ...]
    uuid_slot: dict[str, tuple[int, int]]
    node_row: dict[str, int]
    pool_masks: dict[str, BoolArray]
    pool_nodes: dict[str, BoolArray]
    pool_gpu_count: dict[str, IntArray]

    @property
    def width(self) -> int:
        """G: slots per row."""
        return int(self.free_milli.shape[1])


def _majority_model(models: Iterable[str]) -> str:
    counts = Counter(models)
    best = max(counts.values())
    return next(m for m in models if counts[m] == best)


def _offers_shim(node: Node | None) -> bool:
    """Whether ``auto`` on ``node`` gives a sharing replica a mode that counts its context in
    the slice (``shim``, ``mps+shim``); a node without registered modes counts as one."""
    return node is None or node.isolation_modes is None or "shim" in node.isolation_modes


def build_layout(
    nodes: tuple[Node, ...], devices: tuple[Device, ...], pools: tuple[Pool, ...]
) -> CapacityLayout:
    """The layout of ``nodes``/``devices``/``pools`` (remembered across cycles by the caller's
    :class:`~gpupool.scheduling.memo.SchedulerMemo`)."""
    node_by_name = {n.name: n for n in nodes}
    node_names = sorted(set(node_by_name) | {d.node for d in devices})
    node_row = {name: i for i, name in enumerate(node_names)}
    by_node: dict[str, list[int]] = {name: [] for name in node_names}
    for i, dev in enumerate(devices):
        by_node[dev.node].append(i)
    for idxs in by_node.values():
        idxs.sort(key=lambda i: (devices[i].index, devices[i].uuid))
    n = len(node_names)
    g = max(max((len(v) for v in by_node.values()), default=0), 1)

    node_model_name = [
        _majority_model([devices[i].model for i in by_node[name]]) if by_node[name] else ""
        for name in node_names
    ]
    model_names = tuple(sorted({d.model for d in devices if d.model}))
    model_index = {m: i for i, m in enumerate(model_names)}
    overcommit = {p.name: p.memory_overcommit for p in pools}

    physical = np.zeros((n, g), dtype=np.int64)
    slot_model = np.full((n, g), -1, dtype=np.int64)
    total_mem = np.zeros((n, g), dtype=np.int64)
    usable = np.zeros((n, g), dtype=np.bool_)
    nvlink = np.full((n, g), -1, dtype=np.int64)
    context = np.zeros((n, g), dtype=np.int64)
    auto_context = np.zeros((n, g), dtype=np.int64)
    slot_pool: list[list[str | None]] = [[None] * g for _ in range(n)]
    slot_uuid: list[list[str | None]] = [[None] * g for _ in range(n)]
    uuid_slot: dict[str, tuple[int, int]] = {}
    cpu = np.zeros(n, dtype=np.int64)
    host = np.zeros(n, dtype=np.int64)
    node_model = np.zeros(n, dtype=np.int64)
    schedulable = np.zeros(n, dtype=np.bool_)
    for name, row in node_row.items():
        node = node_by_name.get(name)
        if node is not None:
            cpu[row] = node.cpu_milli
            host[row] = node.memory_mib
            schedulable[row] = node.schedulable
        node_model[row] = model_index.get(node_model_name[row], 0)
        for slot, i in enumerate(by_node[name]):
            dev = devices[i]
            physical[row, slot] = dev.memory_mib
            slot_model[row, slot] = model_index.get(dev.model, 0)
            said = dev.context_reserve_mib
            context[row, slot] = DEFAULT_CONTEXT_RESERVE_MIB if said is None else said
            if dev.is_mig or not _offers_shim(node):
                auto_context[row, slot] = context[row, slot]
            ratio = overcommit.get(dev.pool, 1.0)
            total_mem[row, slot] = int(dev.memory_mib * ratio)
            usable[row, slot] = (
                schedulable[row] and dev.health is DeviceHealth.HEALTHY and dev.pool in overcommit
            )
            if dev.nvlink_group is not None:
                nvlink[row, slot] = dev.nvlink_group
            slot_pool[row][slot] = dev.pool
            slot_uuid[row][slot] = dev.uuid
            uuid_slot[dev.uuid] = (row, slot)

    pool_masks: dict[str, BoolArray] = {}
    pool_nodes: dict[str, BoolArray] = {}
    pool_gpu_count: dict[str, IntArray] = {}
    pools_arr = np.array(slot_pool, dtype=object).reshape(n, g)
    for pool in dict.fromkeys(p.name for p in pools):
        mask: BoolArray = np.asarray(pools_arr == pool, dtype=np.bool_) & usable
        nodes_mask: BoolArray = np.asarray(mask.any(axis=1), dtype=np.bool_)
        if pool == DEFAULT_POOL:
            # Nodes without any GPU take CPU-only jobs of the default pool.
            nodes_mask = np.asarray(
                nodes_mask | ((physical == 0).all(axis=1) & schedulable), dtype=np.bool_
            )
        pool_masks[pool] = _frozen(mask)
        pool_nodes[pool] = _frozen(nodes_mask)
        pool_gpu_count[pool] = _frozen(mask.sum(axis=1).astype(np.int64))

    return CapacityLayout(
        node_names=tuple(node_names),
        model_names=model_names or ("",),
        node_model=_frozen(node_model),
        slot_model=_frozen(slot_model),
        free_milli=_frozen(np.where(physical > 0, 1000, 0).astype(np.int64)),
        total_mem=_frozen(total_mem),
        physical_mem=_frozen(physical),
        usable=_frozen(usable),
        nvlink_group=_frozen(nvlink),
        context_mem=_frozen(context),
        auto_context_mem=_frozen(auto_context),
        cpu_total=_frozen(cpu),
        host_total=_frozen(host),
        gpu_count=_frozen(usable.sum(axis=1).astype(np.int64)),
        slot_pool=tuple(tuple(r) for r in slot_pool),
        slot_uuid=tuple(tuple(r) for r in slot_uuid),
        uuid_slot=uuid_slot,
        node_row=node_row,
        pool_masks=pool_masks,
        pool_nodes=pool_nodes,
        pool_gpu_count=pool_gpu_count,
    )
