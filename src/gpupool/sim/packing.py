"""The packing experiment of the FGD paper, as a simulator scenario.

Reproduces the static experiment of Weng et al. (USENIX ATC 2023) on the Alibaba v2023 trace
(see ``BENCHMARKS.md`` section 1): every pod of a pod list arrives once, in a seeded random order,
is placed or dropped, and never leaves. The same placement policies as the live scheduler do the
placing, through :class:`~gpupool.scheduling.placement.base.CapacityArrays`.

One **run** is ``(pod list, policy, seed)``:

1. **tune**: shuffle the pods with the seed; append pods drawn uniformly with replacement until
   the next draw would push the total GPU request over ``ratio`` (130 %) of the cluster's GPU
   capacity; a list already above that loses random pods instead.
2. **order the nodes**: permute the node rows with the seed. Policies break ties by the lowest
   row, so this is the authors' tie rule (a random rank prefix on every node name, then the
   smallest name) and fixes a random node order for the whole run.
3. **submit** the pods one at a time: ``observe`` the shape (the arrival), then ``place``; the
   pod is dropped when it fits nowhere (GPU count and per-GPU free milli, GPU model, CPU, memory)
   or the policy declines. GPU memory is not constrained in this experiment.
4. **record** after each pod: arrived GPU milli (every pod tried), allocated GPU milli and the
   cluster's fragmentation, measured against the pod list's own shape distribution.

Words: **arrived %** = arrived milli over the cluster's GPU milli; **allocation %** = allocated
milli over the same; the value "at k %" is the mean over the pods whose arrived % rounds to k,
as in the authors' cached curves.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.placement.base import CapacityArrays, PolicyOptions, Shape
from gpupool.scheduling.placement.fgd import TraceInformed
from gpupool.scheduling.placement.fragmentation import ShapeDistribution, node_fragmentation
from gpupool.scheduling.placement.registry import make_policy
from gpupool.sim.alibaba import NodeRecord, PodRecord, read_nodes, read_pods

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: The authors inflate every pod list to 130 % of the cluster's GPU capacity.
DEFAULT_RATIO = 1.3
#: GPU memory is not part of this experiment: every device promises this much.
UNCONSTRAINED_MIB = 1 << 40
#: Highest arrived percentage of the curves (inclusive).
CURVE_POINTS = 131


@dataclass(frozen=True)
class RunSpec:
    """One run: a pod list and a node list (paths), a policy name and a seed."""

    pods: str
    nodes: str
    policy: str
    seed: int
    ratio: float = DEFAULT_RATIO

    @property
    def pod_list(self) -> str:
        """The pod list's short name: ``openb_pod_list_default.csv`` -> ``default``."""
        stem = Path(self.pods).stem
        return stem.removeprefix("openb_pod_list_")


@dataclass(frozen=True)
class RunResult:
    """What one run recorded, one entry per submitted pod, and how long it took."""

    spec: RunSpec
    capacity_milli: int
    arrived_milli: IntArray
    allocated_milli: IntArray
    frag_milli: FloatArray
    placed: int
    dropped: int
    seconds: float

    def curve(self, values: npt.NDArray[np.generic]) -> FloatArray:
        """Mean of ``values`` (as % of capacity) per rounded arrived % (0..130; NaN if none)."""
        return discrete_curve(self.arrived_milli, values, self.capacity_milli)

    @property
    def allocation_curve(self) -> FloatArray:
        return self.curve(self.allocated_milli)

    @property
    def fragmentation_curve(self) -> FloatArray:
        return self.curve(self.frag_milli)

    def allocation_at(self, percent: int) -> float:
        """Allocation % where arrived demand is ``percent`` % of capacity."""
        return float(self.allocation_curve[percent])

    def fragmentation_at(self, percent: int) -> float:
        """Fragmentation (% of capacity) where arrived demand is ``percent`` % of capacity."""
        return float(self.fragmentation_curve[percent])


def discrete_curve(arrived: IntArray, values: npt.NDArray[np.generic], capacity: int) -> FloatArray:
    """Column k: mean of ``values`` over the pods whose arrived % rounds to k, in % of capacity."""
    arrived_pct = np.rint(arrived * 100.0 / capacity).astype(np.int64)
    pct = np.asarray(values, dtype=np.float64) * 100.0 / capacity
    keep = arrived_pct < CURVE_POINTS
    sums = np.bincount(arrived_pct[keep], weights=pct[keep], minlength=CURVE_POINTS)
    counts = np.bincount(arrived_pct[keep], minlength=CURVE_POINTS)
    with np.errstate(invalid="ignore", divide="ignore"):
        curve: FloatArray = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return curve


def build_capacity(nodes: Sequence[NodeRecord]) -> CapacityArrays:
    """Free capacity of ``nodes`` (all free), rows in the given order, GPU memory unconstrained."""
    models = tuple(sorted({n.model for n in nodes if n.model is not None}))
    width = max((n.gpu_count for n in nodes), default=0)
    n = len(nodes)
    usable = np.zeros((n, width), dtype=np.bool_)
    for i, node in enumerate(nodes):
        usable[i, : node.gpu_count] = True
    free = np.where(usable, MILLI_PER_GPU, 0).astype(np.int64)
    mem = np.where(usable, UNCONSTRAINED_MIB, 0).astype(np.int64)
    return CapacityArrays(
        node_names=tuple(node.name for node in nodes),
        model_names=models,
        node_model=np.asarray(
            [models.index(node.model) if node.model is not None else 0 for node in nodes],
            dtype=np.int64,
        ),
        free_milli=free,
        free_mem=mem.copy(),
        total_mem=mem,
        usable=usable,
        cpu_free=np.asarray([node.cpu_milli for node in nodes], dtype=np.int64),
        host_mem_free=np.asarray([node.memory_mib for node in nodes], dtype=np.int64),
    )


def pod_shape(pod: PodRecord, model_names: Sequence[str]) -> Shape:
    """The placement shape of ``pod``; GPU memory is not requested (0 MiB)."""
    models = None
    if pod.gpu_spec is not None and pod.num_gpu > 0:
        models = tuple(name in pod.gpu_spec for name in model_names)
    return Shape(
        milli=pod.gpu_milli if pod.num_gpu > 0 else 0,
        count=pod.num_gpu,
        memory_mib=0,
        cpu_milli=pod.cpu_milli,
        host_memory_mib=pod.memory_mib,
        models=models,
    )


def tune(milli: IntArray, seed: int, capacity_milli: int, ratio: float = DEFAULT_RATIO) -> IntArray:
    """Indices of the submitted pods: shuffled, then inflated (or pruned) to ``ratio``.

    ``milli`` is each pod's total GPU milli. Appending stops at the first draw that would push
    the total over ``ratio * capacity_milli``; pruning removes random pods until it is at most that.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(milli)).astype(np.int64)
    target = ratio * capacity_milli
    total = int(milli.sum())
    if total > target:
        keep = np.ones(len(order), dtype=np.bool_)
        for position in rng.permutation(len(order)):
            if total <= target:
                break
            keep[position] = False
            total -= int(milli[order[position]])
        pruned: IntArray = order[keep]
        return pruned
    extra: list[int] = []
    while len(milli):
        pick = int(rng.integers(len(milli)))
        if total + int(milli[pick]) > target:
            break
        total += int(milli[pick])
        extra.append(pick)
    result: IntArray = np.concatenate([order, np.asarray(extra, dtype=np.int64)])
    return result


@lru_cache(maxsize=16)
def _load_pods(path: str) -> tuple[PodRecord, ...]:
    return read_pods(path)


@lru_cache(maxsize=4)
def _load_nodes(path: str) -> tuple[NodeRecord, ...]:
    return read_nodes(path)


def run_once(spec: RunSpec) -> RunResult:
    """Run one ``(pod list, policy, seed)`` and record the curves."""
    started = time.perf_counter()
    pods = _load_pods(spec.pods)
    nodes = _load_nodes(spec.nodes)
    node_order = np.random.default_rng([spec.seed, 1]).permutation(len(nodes))
    capacity = build_capacity([nodes[i] for i in node_order])
    models = capacity.model_names
    shapes = [pod_shape(p, models) for p in pods]
    capacity_milli = int(capacity.usable.sum()) * MILLI_PER_GPU
    submitted = tune(
        np.asarray([s.total_milli for s in shapes], dtype=np.int64),
        spec.seed,
        capacity_milli,
        spec.ratio,
    )
    measure = ShapeDistribution.from_shapes(shapes, len(models))
    policy = make_policy(spec.policy, PolicyOptions(seed=spec.seed))
    if isinstance(policy, TraceInformed):
        policy.know_trace(shapes, len(models))

    node_frag = node_fragmentation(
        capacity.free_milli, capacity.usable, capacity.cpu_free, capacity.node_model, measure
    )
    frag_total = float(node_frag.sum())
    count = len(submitted)
    arrived = np.zeros(count, dtype=np.int64)
    allocated = np.zeros(count, dtype=np.int64)
    frag = np.zeros(count, dtype=np.float64)
    arrived_sum = allocated_sum = placed = 0
    for i, index in enumerate(submitted):
        shape = shapes[int(index)]
        arrived_sum += shape.total_milli
        policy.observe(shape)
        feasible = capacity.feasible_nodes(shape)
        choice = policy.place(capacity, shape, feasible) if feasible.any() else None
        if choice is not None:
            capacity.allocate(shape, choice)
            allocated_sum += shape.total_milli
            placed += 1
            row = choice.node
            new = float(
                node_fragmentation(
                    capacity.free_milli[row],
                    capacity.usable[row],
                    capacity.cpu_free[row],
                    capacity.node_model[row],
                    measure,
                )
            )
            frag_total += new - float(node_frag[row])
            node_frag[row] = new
        arrived[i] = arrived_sum
        allocated[i] = allocated_sum
        frag[i] = frag_total
    return RunResult(
        spec=spec,
        capacity_milli=capacity_milli,
        arrived_milli=arrived,
        allocated_milli=allocated,
        frag_milli=frag,
        placed=placed,
        dropped=count - placed,
        seconds=time.perf_counter() - started,
    )


def run_many(specs: Sequence[RunSpec], jobs: int | None = None) -> list[RunResult]:
    """Run ``specs`` on ``jobs`` worker processes (default: every core), results in input order."""
    workers = max(1, min(jobs or os.cpu_count() or 1, len(specs)))
    if workers == 1:
        return [run_once(spec) for spec in specs]
    context = multiprocessing.get_context("spawn" if os.name == "nt" else "fork")
    with context.Pool(workers) as pool:
        return pool.map(run_once, specs, chunksize=1)
