"""The placement contract: a mutable, vectorised view of free capacity, and the policy protocol.

Every placement policy (``bestfit``, ``spread``, the FGD paper's baselines, gpupool's
fragmentation-aware default) implements :class:`PlacementPolicy` against
:class:`CapacityArrays`, so the live scheduler, the simulator and the packing experiment run
the same policy code.

Words:

- **slot**: column ``g`` of node row ``n``. A node with 4 GPUs uses slots 0..3; slots past a
  node's GPU count are padding and never ``usable``.
- **shape**: what one replica needs, resolved to integers (:class:`Shape`).
- **choice**: a node row and the slots it takes (:class:`Choice`).
- **model** of a slot: ``slot_model[n, g]``, an index into ``model_names`` (-1 on padding).
  A node may mix models (two A100s and two T4s): every slot is placeable and a request's
  allowed models (``Shape.models``) are checked per slot. One replica's GPUs are always of
  one model (its memory per device and its speed are one number), so on a mixed node a
  replica of several GPUs counts, and takes, the slots of a single model.
  ``node_model`` is a node's majority model, kept only for per-node heuristics
  (fragmentation, scarcity levels) that treat a node as one model.

- **context headroom**: a process's CUDA context (and module images, library workspaces) takes
  device memory beside its slice unless its isolation mode counts it inside (the shim does).
  ``Shape.context`` says which replicas keep it outside (:data:`CONTEXT_OUTSIDE`: always;
  :data:`CONTEXT_AUTO`: where the node's ``auto`` would pick such a mode); on a slot such a
  replica's **footprint** is its slice plus the slot's reserve (``context_mem`` or
  ``auto_context_mem``), so the replicas on a GPU never promise more than it holds, contexts
  included. A proportional request's footprint stays its share of the GPU (at least the
  reserve) and its slice is the footprint less the reserve: "half a GPU" is half the card
  whatever the mode. See :mod:`gpupool.scheduling.layout` for where the reserves come from.

``CapacityArrays`` is updated incrementally with :meth:`CapacityArrays.allocate` and
:meth:`CapacityArrays.release` as the scheduler commits placements within a cycle, so no
policy ever rebuilds per-device state for each job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from gpupool.domain.units import MILLI_PER_GPU

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: ``Shape.context``: the replica's context lies inside its slice (or it has the GPU alone).
CONTEXT_INSIDE = 0
#: It lies outside its slice on every node (isolation ``mps``, ``soft``, ``mig`` sharing).
CONTEXT_OUTSIDE = 1
#: Isolation ``auto``: outside where the node would pick such a mode (``auto_context_mem``).
CONTEXT_AUTO = 2
#: Modes that count the context inside the slice (or give the replica whole GPUs).
CONTEXT_INSIDE_MODES = frozenset({"shim", "mps+shim", "exclusive"})


def context_of(isolation: str, milli: int, count: int) -> int:
    """``Shape.context`` for a replica of ``count`` GPUs at ``milli`` each under ``isolation``.

    A replica with whole GPUs has them alone, so its context takes nobody's memory.
    """
    if count == 0 or milli >= MILLI_PER_GPU or isolation in CONTEXT_INSIDE_MODES:
        return CONTEXT_INSIDE
    return CONTEXT_AUTO if isolation == "auto" else CONTEXT_OUTSIDE


@dataclass(frozen=True)
class PolicyOptions:
    """Construction options shared by every policy. ``seed`` feeds any randomness."""

    seed: int = 0


@dataclass(frozen=True)
class Shape:
    """One replica's needs, in integers.

    ``milli`` is per device (1..1000) and ``count`` the number of devices (0 for a CPU-only
    replica). ``memory_mib`` is per device; ``None`` means "the device's memory times
    ``milli / 1000``". ``models`` is a boolean mask over ``CapacityArrays.model_names`` of the
    acceptable GPU models, or ``None`` for any model. ``context`` is where the replica's CUDA
    context lies (:data:`CONTEXT_INSIDE`, :data:`CONTEXT_OUTSIDE`, :data:`CONTEXT_AUTO`): outside,
    each slot it takes also loses that slot's context reserve.
    """

    milli: int
    count: int
    memory_mib: int | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0
    models: tuple[bool, ...] | None = None
    context: int = CONTEXT_INSIDE

    @property
    def is_sharing(self) -> bool:
        """True for a fraction of one device."""
        return self.count == 1 and self.milli < MILLI_PER_GPU

    @property
    def total_milli(self) -> int:
        return self.milli * self.count


@dataclass(frozen=True)
class Choice:
    """Where one replica goes: node row ``node`` and the slots ``slots`` on it."""

    node: int
    slots: tuple[int, ...]


@dataclass
class CapacityArrays:
    """Free capacity of every node and device, as numpy arrays (rows = nodes, cols = slots).

    Memory arrays are in MiB and already include the pool's overcommit ratio: ``free_mem`` is
    what may still be *promised* on a device. ``usable`` is False for padding, unhealthy
    devices and devices outside the pool being scheduled. ``physical_mem`` is the device's
    real memory, the base of proportional requests (``Shape.memory_mib is None``); it defaults
    to ``total_mem``, which is right when nothing is overcommitted. ``context_mem`` is each
    slot's context reserve, kept as headroom by a replica whose context lies outside its slice;
    ``auto_context_mem`` the same where an ``auto`` replica's would (0 elsewhere); both default
    to zeros (no headroom).
    """

    node_names: tuple[str, ...]
    model_names: tuple[str, ...]
    node_model: IntArray  # [N] index into model_names: the node's majority model (heuristics)
    free_milli: IntArray  # [N, G]
    free_mem: IntArray  # [N, G]
    total_mem: IntArray  # [N, G] physical memory times overcommit (for proportional requests)
    usable: BoolArray  # [N, G]
    cpu_free: IntArray  # [N] milli-CPU
    host_mem_free: IntArray  # [N] MiB
    nvlink_group: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    cpu_total: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpu_count: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    physical_mem: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    # [N, G] model index of each slot (-1 on padding); defaults to node_model on every slot.
    slot_model: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    context_mem: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    auto_context_mem: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    # milli -> [N, G] memory a proportional request of that share needs (physical_mem is fixed).
    _proportional: dict[int, IntArray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        n, g = self.free_milli.shape
        if self.nvlink_group.shape != (n, g):
            self.nvlink_group = np.full((n, g), -1, dtype=np.int64)
        if self.physical_mem.shape != (n, g):
            self.physical_mem = self.total_mem
        if self.cpu_total.shape != (n,):
            self.cpu_total = self.cpu_free.copy()
        if self.gpu_count.shape != (n,):
            self.gpu_count = self.usable.sum(axis=1).astype(np.int64)
        if self.slot_model.shape != (n, g):
            self.slot_model = np.repeat(self.node_model.reshape(n, 1), g, axis=1)
        if self.context_mem.shape != (n, g):
            self.context_mem = np.zeros((n, g), dtype=np.int64)
        if self.auto_context_mem.shape != (n, g):
            self.auto_context_mem = np.zeros((n, g), dtype=np.int64)
        # Which headroom arrays hold anything: none, the common case, keeps the plain paths.
        self._headroom: dict[int, IntArray | None] = {
            CONTEXT_INSIDE: None,
            CONTEXT_OUTSIDE: self.context_mem if self.context_mem.any() else None,
            CONTEXT_AUTO: self.auto_context_mem if self.auto_context_mem.any() else None,
        }
        self._mixed: IntArray | None = None  # rows whose slots hold several models (lazy)

    @property
    def num_nodes(self) -> int:
        return int(self.free_milli.shape[0])

    @property
    def mixed_rows(self) -> IntArray:
        """The rows whose slots hold more than one model (computed once, shared by views)."""
        if self._mixed is None:
            real = self.slot_model >= 0
            top = np.where(real, self.slot_model, -1).max(axis=1, initial=-1)
            low = np.where(real, self.slot_model, np.iinfo(np.int64).max).min(
                axis=1, initial=np.iinfo(np.int64).max
            )
            self._mixed = np.flatnonzero(real.any(axis=1) & (top != low)).astype(np.int64)
        return self._mixed

    def model_allowed(self, models: tuple[bool, ...]) -> BoolArray:
        """[N, G] mask of the slots whose model is in ``models`` (padding never is)."""
        allowed = np.zeros(len(self.model_names) + 1, dtype=np.bool_)
        width = min(len(models), len(self.model_names))
        allowed[:width] = models[:width]
        found: BoolArray = allowed[self.slot_model]  # -1 (padding) reads the last, False
        return found

    def count_one_model(self, fits: BoolArray) -> npt.NDArray[np.float64]:
        """[N] fitting slots per row, of the single model with most of them on mixed rows.

        ``fits`` is an [N, G] mask (e.g. :meth:`slot_fits`); on rows with one model this is
        its row sum.
        """
        counts: npt.NDArray[np.float64] = fits @ np.ones(fits.shape[1])
        mixed = self.mixed_rows
        if len(mixed):
            sub, models = fits[mixed], self.slot_model[mixed]
            best = np.zeros(len(mixed))
            for m in np.unique(models[models >= 0]):
                best = np.maximum(best, (sub & (models == m)).sum(axis=1))
            counts[mixed] = best
        return counts

    def whole_per_row(self, fits: BoolArray, count: int) -> IntArray:
        """[N] how many replicas of ``count`` whole GPUs each row holds (one model each)."""
        per: IntArray = fits.sum(axis=1).astype(np.int64) // max(count, 1)
        mixed = self.mixed_rows
        if len(mixed) and count > 1:
            sub, models = fits[mixed], self.slot_model[mixed]
            total = np.zeros(len(mixed), dtype=np.int64)
            for m in np.unique(models[models >= 0]):
                total += (sub & (models == m)).sum(axis=1) // count
            per[mixed] = total
        return per

    def one_model_slots(self, fits: BoolArray, node: int, count: int) -> BoolArray:
        """``fits`` ([G], one row) kept to one model when ``node`` mixes models and ``count``
        GPUs must come from it: the model with the fewest fitting slots that are enough
        (best fit, so the larger group stays whole; lowest model index on ties)."""
        if count <= 1 or node not in self.mixed_rows:
            return fits
        models = self.slot_model[node]
        best: tuple[int, int] | None = None  # (fitting slots, model)
        for m in sorted({int(x) for x in models[fits] if x >= 0}):
            n_fit = int((fits & (models == m)).sum())
            if n_fit >= count and (best is None or n_fit < best[0]):
                best = (n_fit, m)
        if best is None:
            return np.zeros_like(fits)
        kept: BoolArray = fits & (models == best[1])
        return kept

    def headroom(self, shape: Shape) -> IntArray | None:
        """[N, G] what ``shape``'s context takes beside its slice per slot (``None``: none)."""
        return self._headroom[shape.context] if shape.count else None

    def memory_need(self, shape: Shape, node: int) -> IntArray:
        """Memory ``shape`` takes on each slot of ``node``: its footprint, the slice (resolving
        proportional requests) and the headroom its context needs there."""
        room = self.headroom(shape)
        if shape.memory_mib is not None:
            need = np.full(self.free_mem.shape[1], shape.memory_mib, dtype=np.int64)
            return need if room is None else need + room[node]
        share: IntArray = self.physical_mem[node] * shape.milli // MILLI_PER_GPU
        return share if room is None else np.maximum(share, room[node]).astype(np.int64)

    def footprint(self, shape: Shape) -> IntArray | int:
        """What ``shape`` takes off ``free_mem`` on every slot ([N, G], or one number)."""
        room = self.headroom(shape)
        if shape.memory_mib is not None:
            return shape.memory_mib if room is None else room + shape.memory_mib
        share = self.proportional_need(shape.milli)
        if room is None:
            return share
        key = -(shape.context * (MILLI_PER_GPU + 1) + shape.milli)  # apart from plain shares
        found = self._proportional.get(key)
        if found is None:
            found = np.maximum(share, room).astype(np.int64)
            self._proportional[key] = found
        return found

    def slice_at(self, shape: Shape, choice: Choice) -> Shape:
        """``shape`` with its slice per device made explicit for ``choice``: a proportional
        request's share less the headroom its context keeps beside it there."""
        if shape.memory_mib is not None or not choice.slots:
            return shape
        # Proportional memory is the same on every slot of one choice (one model per replica).
        n, s = choice.node, choice.slots[0]
        share = int(self.physical_mem[n, s]) * shape.milli // MILLI_PER_GPU
        room = self.headroom(shape)
        if room is not None:
            share = max(share, int(room[n, s])) - int(room[n, s])
        return replace(shape, memory_mib=share)

    def held_shape(self, shape: Shape, choice: Choice) -> Shape:
        """A resolved ``shape`` at ``choice`` as one plain amount: its slice plus its headroom
        (what a release of it gives back, for code that adds ``memory_mib`` by hand)."""
        room = self.headroom(shape)
        if room is None or not choice.slots:
            return shape
        extra = int(room[choice.node, choice.slots[0]])
        return replace(shape, memory_mib=(shape.memory_mib or 0) + extra, context=CONTEXT_INSIDE)

    def proportional_need(self, milli: int) -> IntArray:
        """[N, G] memory of a proportional request of ``milli`` per device (cached)."""
        found = self._proportional.get(milli)
        if found is None:
            found = self.physical_mem * milli // MILLI_PER_GPU
            self._proportional[milli] = found
        return found

    def slot_fits(self, shape: Shape) -> BoolArray:
        """[N, G] mask: the slot can take one device's worth of ``shape`` (milli, memory and
        an allowed model)."""
        ok = self.usable & (self.free_milli >= shape.milli)
        ok &= self.free_mem >= self.footprint(shape)
        if shape.models is not None:
            ok &= self.model_allowed(shape.models)
        return ok

    def slot_fits_on_node(self, shape: Shape, node: int) -> BoolArray:
        """[G] mask of :meth:`slot_fits` for one node row only (cheap for what-if checks)."""
        ok = self.usable[node] & (self.free_milli[node] >= shape.milli)
        fits: BoolArray = ok & (self.free_mem[node] >= self.memory_need(shape, node))
        if shape.models is not None:
            allowed = np.zeros(len(self.model_names) + 1, dtype=np.bool_)
            width = min(len(shape.models), len(self.model_names))
            allowed[:width] = shape.models[:width]
            fits &= allowed[self.slot_model[node]]
        return fits

    def fits_on_node(self, shape: Shape, node: int) -> bool:
        """True when ``shape`` fits on ``node`` now: model, CPU, host memory and enough slots."""
        if (
            self.cpu_free[node] < shape.cpu_milli
            or self.host_mem_free[node] < shape.host_memory_mib
        ):
            return False
        if shape.count == 0:
            return True
        fits = self.slot_fits_on_node(shape, node)
        if shape.count > 1:
            fits = self.one_model_slots(fits, node, shape.count)
        return int(fits.sum()) >= shape.count

    def feasible_nodes(self, shape: Shape) -> BoolArray:
        """[N] mask of nodes where ``shape`` fits: CPU, host memory, enough slots of an
        allowed model (of one model, for several GPUs)."""
        ok = (self.cpu_free >= shape.cpu_milli) & (self.host_mem_free >= shape.host_memory_mib)
        if shape.count == 0:
            return ok
        if shape.count > 1 and len(self.mixed_rows):
            fits = self.count_one_model(self.slot_fits(shape))
        else:
            # A float matrix-vector product counts fitting slots per node several times
            # faster than a boolean sum along the short axis.
            fits = self.slot_fits(shape) @ np.ones(self.free_milli.shape[1])
        result: BoolArray = ok & (fits >= shape.count)
        return result

    def allocate(self, shape: Shape, choice: Choice) -> None:
        """Take ``shape`` at ``choice``; raises ``ValueError`` if it does not fit (no change)."""
        n, slots = choice.node, list(choice.slots)
        if len(slots) != shape.count or len(set(slots)) != len(slots):
            raise ValueError(f"choice {choice} does not give {shape.count} distinct slots")
        need_mem = self.memory_need(shape, n)
        if (
            self.cpu_free[n] < shape.cpu_milli
            or self.host_mem_free[n] < shape.host_memory_mib
            or any(not self.usable[n, s] for s in slots)
            or any(self.free_milli[n, s] < shape.milli for s in slots)
            or any(self.free_mem[n, s] < need_mem[s] for s in slots)
        ):
            raise ValueError(f"shape {shape} does not fit at {choice}")
        self.cpu_free[n] -= shape.cpu_milli
        self.host_mem_free[n] -= shape.host_memory_mib
        for s in slots:
            self.free_milli[n, s] -= shape.milli
            self.free_mem[n, s] -= need_mem[s]

    def release(self, shape: Shape, choice: Choice) -> None:
        """Give back what :meth:`allocate` took for ``shape`` at ``choice``."""
        n = choice.node
        self.cpu_free[n] += shape.cpu_milli
        self.host_mem_free[n] += shape.host_memory_mib
        if shape.memory_mib is not None and self.headroom(shape) is None:  # one amount
            for s in choice.slots:
                self.free_milli[n, s] += shape.milli
                self.free_mem[n, s] += shape.memory_mib
            return
        need_mem = self.memory_need(shape, n)
        for s in choice.slots:
            self.free_milli[n, s] += shape.milli
            self.free_mem[n, s] += need_mem[s]

    def share_cache(self, other: CapacityArrays) -> None:
        """Reuse ``other``'s derived caches; only valid when both have equal ``physical_mem``
        and ``slot_model``."""
        self._proportional = other._proportional
        if self.slot_model is other.slot_model:
            self._mixed = other._mixed

    def copy(self) -> CapacityArrays:
        """An independent copy (for what-if evaluation such as preemption)."""
        out = CapacityArrays(
            node_names=self.node_names,
            model_names=self.model_names,
            node_model=self.node_model.copy(),
            free_milli=self.free_milli.copy(),
            free_mem=self.free_mem.copy(),
            total_mem=self.total_mem.copy(),
            usable=self.usable.copy(),
            cpu_free=self.cpu_free.copy(),
            host_mem_free=self.host_mem_free.copy(),
            nvlink_group=self.nvlink_group.copy(),
            cpu_total=self.cpu_total.copy(),
            gpu_count=self.gpu_count.copy(),
            physical_mem=self.physical_mem.copy(),
            slot_model=self.slot_model,  # static: never changed in place
            context_mem=self.context_mem,  # static likewise
            auto_context_mem=self.auto_context_mem,
        )
        out.share_cache(self)  # physical memory is equal by construction
        return out


class PlacementPolicy(Protocol):
    """Chooses where one replica goes.

    Contract:

    - :meth:`place` returns a :class:`Choice` whose node is in ``feasible`` and whose slots
      can hold ``shape`` (``CapacityArrays.slot_fits``), or ``None`` when it declines. It does
      not modify ``capacity``; the caller allocates.
    - It is deterministic: any randomness comes from a seed given at construction.
    - :meth:`observe` is told about every job the scheduler sees arrive (in arrival order), so
      fragmentation-aware policies can learn the workload's shape mix online. It must only use
      what it was shown.
    """

    name: ClassVar[str]
    #: ``False`` when :meth:`observe` does nothing: the scheduler then gathers no arrivals.
    learns: ClassVar[bool]

    def place(self, capacity: CapacityArrays, shape: Shape, feasible: BoolArray) -> Choice | None:
        """Pick a node in ``feasible`` and slots on it for ``shape``."""
        ...

    def observe(self, shape: Shape) -> None:
        """Learn from an arriving replica shape (no-op for policies that do not learn)."""
        ...


def best_fit_slots(capacity: CapacityArrays, shape: Shape, node: int) -> tuple[int, ...]:
    """Slots for ``shape`` on ``node``: for a share, the fitting GPU with least free milli
    (lowest index on ties); for whole GPUs, the free GPUs in index order."""
    if shape.count == 0:
        return ()
    fits = capacity.one_model_slots(capacity.slot_fits_on_node(shape, node), node, shape.count)
    idx = np.flatnonzero(fits)
    if len(idx) < shape.count:
        raise ValueError(f"node {node} has {len(idx)} slots for {shape}, needs {shape.count}")
    if shape.is_sharing:
        free = capacity.free_milli[node, idx]
        return (int(idx[int(np.argmin(free))]),)
    return tuple(int(i) for i in idx[: shape.count])


def topology_slots(capacity: CapacityArrays, shape: Shape, node: int) -> tuple[int, ...]:
    """Slots for a multi-GPU ``shape`` on ``node``, kept inside one NVLink group when possible.

    Among the NVLink groups with enough fitting slots, the one with the fewest fitting slots is
    used (best fit, so big groups stay whole for big jobs; lowest group id on ties); without
    such a group (or NVLink information) this is :func:`best_fit_slots`.
    """
    if shape.count <= 1:
        return best_fit_slots(capacity, shape, node)
    fits = capacity.one_model_slots(capacity.slot_fits_on_node(shape, node), node, shape.count)
    groups = capacity.nvlink_group[node]
    best: tuple[int, int] | None = None  # (fitting slots, group id)
    for group in sorted({int(g) for g in groups[fits] if g >= 0}):
        n_fit = int((fits & (groups == group)).sum())
        if n_fit >= shape.count and (best is None or n_fit < best[0]):
            best = (n_fit, group)
    if best is None:
        return best_fit_slots(capacity, shape, node)
    idx = np.flatnonzero(fits & (groups == best[1]))
    return tuple(int(i) for i in idx[: shape.count])


def best_scored_choice(
    capacity: CapacityArrays, shape: Shape, feasible: BoolArray, scores: IntArray
) -> Choice | None:
    """The feasible node with the highest integer score (lowest row on ties), best-fit slots.

    The shared last step of the score-then-argmax policies (DotProd, GpuPacking, ...).
    """
    if not feasible.any():
        return None
    node = int(np.argmax(np.where(feasible, scores, -1)))
    return Choice(node=node, slots=best_fit_slots(capacity, shape, node))
