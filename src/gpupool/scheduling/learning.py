"""What the placement policies that learn are shown each cycle (``PlacementPolicy.observe``).

A policy that learns the workload online (``fragaware``: the mix of request shapes) is shown,
every cycle, the shape of each replica of its pool's jobs in **arrival order**: running jobs by
start time, pending ones by submit time, then job id, each gang replica once. Policies that
learn nothing (``learns = False``) are not shown anything, and when no pool's policy learns
the queue is not even gathered.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter

from gpupool.scheduling.capacity import ClusterCapacity
from gpupool.scheduling.placement.base import PlacementPolicy, Shape
from gpupool.scheduling.snapshot import ClusterSnapshot


def show_arrivals(
    snapshot: ClusterSnapshot, capacity: ClusterCapacity, learners: Mapping[str, PlacementPolicy]
) -> None:
    """Show each policy of ``learners`` (pool name -> its policy) its pool's shapes, in order."""
    if not learners:
        return
    seen: list[tuple[float, str, str, Shape]] = []
    append = seen.append
    held_by = capacity.held_by
    for job_id, replicas in snapshot.running_by_job.items():
        first = replicas[0]
        if first.pool not in learners:
            continue
        for r in replicas:
            held = held_by(r)
            if held is not None:
                append((first.start_time, job_id, first.pool, held[0]))
    shape_for = capacity.shape_for
    for job in snapshot.pending:
        spec = job.spec
        if spec.pool in learners:
            shape = shape_for(spec.resources, spec.isolation.value)
            entry = (job.submit_time, job.id, spec.pool, shape)
            if spec.replicas == 1:
                append(entry)
            else:
                seen.extend([entry] * spec.replicas)
    if not seen:
        return
    seen.sort(key=itemgetter(0, 1))
    by_pool: dict[str, list[Shape]] = {}
    for _, _, pool_name, shape in seen:
        shapes = by_pool.get(pool_name)
        if shapes is None:
            shapes = by_pool[pool_name] = []
        shapes.append(shape)
    for pool_name, shapes in by_pool.items():
        observe = learners[pool_name].observe
        for shape in shapes:
            observe(shape)
