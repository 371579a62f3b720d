"""Stage 3's engine: place every replica of one job, all or nothing, and say why it fails.

:func:`place_job` asks the pool's :class:`~gpupool.scheduling.placement.base.PlacementPolicy`
for a node per replica and allocates on the arrays it is given. Rules that hold for every
policy live here, so no policy can break them:

- **all or nothing**: a gang's replicas are allocated one by one and, if one does not fit, the
  ones already taken are released again; the arrays end as they started.
- **same node first**: a gang whose replicas all fit on one node is put on one node (the policy
  picks the node for the combined shape), otherwise each replica is placed on its own.
- **NVLink**: a replica (or gang) with several GPUs on one node takes slots inside one NVLink
  group when one has room (:func:`~gpupool.scheduling.placement.base.topology_slots`).

:func:`diagnose` explains a failure with a :class:`~gpupool.scheduling.decision.PendingReason`
by checking the request one resource at a time: GPU type, would it ever fit, GPU share, GPU
memory, CPU, host memory, and finally whether only part of a gang fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpupool.domain.units import MILLI_PER_GPU, format_cpus, format_gpus, format_memory
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.placement.base import (
    CONTEXT_INSIDE,
    BoolArray,
    CapacityArrays,
    Choice,
    PlacementPolicy,
    Shape,
    topology_slots,
)


@dataclass(frozen=True)
class Placed:
    """One replica's place: its shape (memory resolved) and its choice."""

    shape: Shape
    choice: Choice


def resolved(capacity: CapacityArrays, shape: Shape, choice: Choice) -> Shape:
    """``shape`` with its memory per device made explicit for the chosen slots (a proportional
    request's slice leaves out the context headroom it keeps there: ``slice_at``)."""
    return capacity.slice_at(shape, choice)


def _combined(shape: Shape, replicas: int) -> Shape:
    return replace(
        shape,
        count=shape.count * replicas,
        cpu_milli=shape.cpu_milli * replicas,
        host_memory_mib=shape.host_memory_mib * replicas,
    )


def _allocate(capacity: CapacityArrays, shape: Shape, choice: Choice) -> Placed:
    placed = Placed(resolved(capacity, shape, choice), choice)
    capacity.allocate(placed.shape, choice)
    return placed


def release_all(capacity: CapacityArrays, placed: list[Placed] | tuple[Placed, ...]) -> None:
    """Give back what :func:`place_job` allocated."""
    for p in reversed(placed):
        capacity.release(p.shape, p.choice)


def allocate_all(capacity: CapacityArrays, placed: tuple[Placed, ...]) -> None:
    """Take the same places on other arrays (raises ``ValueError`` if one does not fit)."""
    done: list[Placed] = []
    try:
        for p in placed:
            capacity.allocate(p.shape, p.choice)
            done.append(p)
    except ValueError:
        release_all(capacity, done)
        raise


def place_job(
    capacity: CapacityArrays,
    policy: PlacementPolicy,
    shape: Shape,
    replicas: int,
    nodes: BoolArray,
) -> tuple[Placed, ...] | None:
    """Place ``replicas`` copies of ``shape`` on ``capacity`` (allocated), or ``None`` (unchanged).

    ``nodes`` masks the node rows the job may use (its pool's nodes).
    """
    if replicas > 1 and shape.count > 0:
        together = _combined(shape, replicas)
        feasible = capacity.feasible_nodes(together) & nodes
        if feasible.any():
            choice = policy.place(capacity, together, feasible)
            if choice is not None:
                slots = topology_slots(capacity, together, choice.node)
                placed = []
                for r in range(replicas):
                    part = Choice(choice.node, slots[r * shape.count : (r + 1) * shape.count])
                    placed.append(_allocate(capacity, shape, part))
                return tuple(placed)
    taken: list[Placed] = []
    for _ in range(replicas):
        feasible = capacity.feasible_nodes(shape) & nodes
        choice = policy.place(capacity, shape, feasible) if feasible.any() else None
        if choice is None:
            release_all(capacity, taken)
            return None
        if shape.count > 1:
            choice = Choice(choice.node, topology_slots(capacity, shape, choice.node))
        taken.append(_allocate(capacity, shape, choice))
    return tuple(taken)


def fits_somewhere(capacity: CapacityArrays, shape: Shape, nodes: BoolArray) -> bool:
    """True when one replica of ``shape`` fits on some node in ``nodes``."""
    return bool((capacity.feasible_nodes(shape) & nodes).any())


def replicas_that_fit(capacity: CapacityArrays, shape: Shape, nodes: BoolArray) -> int:
    """How many replicas of ``shape`` fit at once, counting per node (an upper bound)."""
    feasible = capacity.feasible_nodes(shape) & nodes
    if not feasible.any():
        return 0
    rows = np.flatnonzero(feasible)
    if shape.count == 0:
        per_cpu = capacity.cpu_free[rows] // max(shape.cpu_milli, 1)
        return int(per_cpu.sum())
    slots = capacity.slot_fits(shape)[rows]
    if shape.is_sharing:
        per_slot = np.where(slots, capacity.free_milli[rows] // shape.milli, 0)
        per_node = per_slot.sum(axis=1)
    else:
        per_node = capacity.whole_per_row(capacity.slot_fits(shape), shape.count)[rows]
    cpu_cap = capacity.cpu_free[rows] // max(shape.cpu_milli, 1)
    return int(np.minimum(per_node, cpu_cap).sum())


def _bare(shape: Shape) -> Shape:
    """``shape`` with its context counted inside its slice (no headroom)."""
    return replace(shape, context=CONTEXT_INSIDE)


def _context_words(capacity: CapacityArrays, shape: Shape, nodes: BoolArray) -> str:
    """``768 MiB per replica on each GPU`` (or a range) for the headroom ``shape`` keeps."""
    room = capacity.headroom(shape)
    assert room is not None
    seen = room[nodes][capacity.usable[nodes]]
    seen = seen[seen > 0]
    if not len(seen):
        return "no reserve on these GPUs"
    low, high = int(seen.min()), int(seen.max())
    span = format_memory(low) if low == high else f"{format_memory(low)} to {format_memory(high)}"
    return f"{span} per replica on each GPU, as its node measured it"


def describe(shape: Shape, replicas: int) -> str:
    """``2 x (0.5 of a GPU with 10GiB each, 4 CPUs, 16GiB host memory)`` for messages."""
    if shape.count == 0:
        gpu = "no GPU"
    elif shape.is_sharing:
        gpu = f"{format_gpus(shape.milli)} of a GPU"
    else:
        gpu = f"{shape.count} GPU{'s' if shape.count > 1 else ''}"
    if shape.count and shape.memory_mib is not None:
        gpu += f" with {format_memory(shape.memory_mib)} each"
    text = f"{gpu}, {format_cpus(shape.cpu_milli)} CPUs"
    if shape.host_memory_mib:
        text += f", {format_memory(shape.host_memory_mib)} host memory"
    return f"{replicas} x ({text})" if replicas > 1 else text


def diagnose(
    live: CapacityArrays,
    empty: CapacityArrays,
    shape: Shape,
    replicas: int,
    nodes: BoolArray,
    *,
    pool: str,
) -> tuple[PendingReason, str]:
    """Why ``replicas`` x ``shape`` does not place on ``live`` (``empty``: the pool unused)."""
    what = describe(shape, replicas)
    if shape.count > 0 and shape.models is not None:
        allowed = (live.usable & live.model_allowed(shape.models)).any(axis=1)
        if not (nodes & allowed).any():
            return (
                PendingReason.NO_DEVICE_OF_TYPE,
                f"pool {pool} has no usable GPU of an allowed type for {what}: allow more "
                "GPU types or use another pool",
            )
    ever = replicas_that_fit(empty, shape, nodes)
    if ever < replicas and replicas_that_fit(empty, _bare(shape), nodes) >= replicas:
        return (
            PendingReason.TOO_LARGE,
            f"{what} does not fit pool {pool} even when it is empty once each replica's CUDA "
            f"context is counted beside its slice ({_context_words(empty, shape, nodes)}): "
            "ask for less GPU memory, or submit with isolation shim, which counts the context "
            "inside the slice",
        )
    if ever < replicas:
        mixed = shape.count > 1 and bool(nodes[empty.mixed_rows].any())
        gpus = empty.count_one_model(empty.usable) if mixed else empty.gpu_count
        biggest = int(gpus[nodes].max()) if nodes.any() else 0
        most_cpu = int(empty.cpu_total[nodes].max()) if nodes.any() else 0
        kind = "GPUs of one model" if mixed else "GPUs"
        return (
            PendingReason.TOO_LARGE,
            f"{what} does not fit pool {pool} even when it is empty (its largest node has "
            f"{biggest} {kind} and {format_cpus(most_cpu)} CPUs): ask for less per replica",
        )
    model_ok = nodes.copy()
    if shape.count > 0:
        milli_ok = live.usable & (live.free_milli >= shape.milli)
        if shape.models is not None:
            milli_ok &= live.model_allowed(shape.models)
        stage_gpu = model_ok & (live.count_one_model(milli_ok) >= shape.count)
        if not stage_gpu.any():
            free = (
                f"{shape.count} free GPU(s)"
                if shape.milli >= MILLI_PER_GPU
                else f"a GPU with {format_gpus(shape.milli)} free"
            )
            return (
                PendingReason.INSUFFICIENT_GPU,
                f"no node of pool {pool} has {free} for {what}; it starts when running jobs end",
            )
        stage_mem = model_ok & (live.count_one_model(live.slot_fits(shape)) >= shape.count)
        if not stage_mem.any() and live.headroom(shape) is not None:
            # Free memory is what the cards hold less every replica's slice and the contexts
            # kept beside them: a footprint above it would overrun the card.
            return (
                PendingReason.INSUFFICIENT_MEMORY,
                f"GPU share is free in pool {pool} but not the GPU memory {what} needs with its "
                "CUDA context, which this isolation mode keeps outside the slice "
                f"({_context_words(live, shape, nodes)}): placing it would overrun the card; "
                "it starts when running jobs end, or submit with isolation shim, which counts "
                "the context inside the slice",
            )
        if not stage_mem.any():
            return (
                PendingReason.INSUFFICIENT_MEMORY,
                f"GPU share is free in pool {pool} but not the GPU memory {what} needs; it "
                "starts when running jobs end (or ask for less GPU memory)",
            )
    else:
        stage_mem = model_ok
    stage_cpu = stage_mem & (live.cpu_free >= shape.cpu_milli)
    if not stage_cpu.any():
        return (
            PendingReason.INSUFFICIENT_CPU,
            f"GPUs are free in pool {pool} but not {format_cpus(shape.cpu_milli)} CPUs on the "
            f"same node for {what}",
        )
    stage_host = stage_cpu & (live.host_mem_free >= shape.host_memory_mib)
    if not stage_host.any():
        return (
            PendingReason.INSUFFICIENT_HOST_MEMORY,
            f"GPUs and CPUs are free in pool {pool} but not {format_memory(shape.host_memory_mib)}"
            f" of host memory on the same node for {what}",
        )
    now_fit = replicas_that_fit(live, shape, nodes)
    if replicas > 1 and now_fit < replicas:
        return (
            PendingReason.GANG_INCOMPLETE,
            f"only {now_fit} of the {replicas} replicas of this gang fit now ({what}); a gang "
            "starts whole or not at all",
        )
    # Fits by every count, but the policy or the exact slot combination declined it.
    return (
        PendingReason.INSUFFICIENT_GPU,
        f"no placement found for {what} in pool {pool}; it starts when running jobs end",
    )
