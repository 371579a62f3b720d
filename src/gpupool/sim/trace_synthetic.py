"""Synthetic workloads: Poisson arrivals, a mixture of job shapes, tenants with quotas.

Words:

- **shape**: (milli-GPU per replica, replicas, probability). :data:`DEFAULT_SHAPES` mixes
  quarter, half and whole GPUs with 2-, 4- and 8-GPU jobs, in proportions close to the Alibaba
  trace's GPU pods plus some larger training jobs.
- **load**: offered GPU demand over capacity. Arrivals are Poisson with the rate that makes
  ``rate x mean(GPUs x work) = load x GPUs``; 0.9 keeps a cluster busy with queues that drain.
- **work**: log-normal, median ``median_work_s``, log standard deviation ``work_sigma``,
  capped at ``max_work_s``.
- **tenants**: ``tenants`` teams with Zipf-like weights (team 0 the largest); each is
  guaranteed its weight's part of the cluster (no limit: it may borrow the idle rest) and
  submits that part of the jobs. Jobs are ``high`` 10 %, ``normal`` 70 %, ``low`` and
  preemptible 20 %; normal jobs are preemptible too, only high ones are not. Only preemptible
  jobs may borrow, so a high job larger than its tenant's guarantee is made preemptible (it
  could never start otherwise).

Everything comes from one ``numpy`` generator seeded with ``seed``: the same spec and seed give
the same workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpupool.domain.pools import DEFAULT_POOL
from gpupool.domain.tenants import Quota, Tenant
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.sim.workload import SimCluster, TraceJob, Workload, uniform_cluster

DEFAULT_SHAPES: tuple[tuple[int, int, float], ...] = (
    (250, 1, 0.20),
    (500, 1, 0.20),
    (1000, 1, 0.35),
    (2000, 1, 0.10),
    (4000, 1, 0.08),
    (8000, 1, 0.05),
    (8000, 2, 0.02),
)

PRIORITY_MIX: tuple[tuple[str, bool, float], ...] = (
    ("high", False, 0.10),
    ("normal", True, 0.70),
    ("low", True, 0.20),
)


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate; see the module docstring for the words."""

    jobs: int = 10_000
    gpus: int = 1000
    tenants: int = 4
    load: float = 0.9
    median_work_s: float = 1800.0
    work_sigma: float = 1.2
    max_work_s: float = 86400.0
    shapes: tuple[tuple[int, int, float], ...] = DEFAULT_SHAPES
    gpus_per_node: int = 8
    model: str = "A100-80GB"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.gpus < 1 or self.tenants < 1 or self.gpus_per_node < 1:
            raise ValueError("jobs, gpus, tenants and gpus_per_node must be at least 1")
        if not self.load > 0:
            raise ValueError("load must be above 0 (0.9 = 90 % of the cluster's GPUs)")
        if not self.shapes or any(p <= 0 for _, _, p in self.shapes):
            raise ValueError("shapes need positive probabilities")
        for milli, _, _ in self.shapes:
            if milli > self.gpus_per_node * MILLI_PER_GPU:
                raise ValueError(
                    f"shape of {milli}m is larger than one {self.gpus_per_node}-GPU node"
                )


def synthetic_cluster(spec: SyntheticSpec) -> SimCluster:
    """``spec.gpus`` GPUs of ``spec.model`` on machines of ``spec.gpus_per_node``."""
    return uniform_cluster(spec.gpus, spec.model, spec.gpus_per_node)


def synthetic_workload(spec: SyntheticSpec) -> Workload:
    """Generate the workload of ``spec`` (deterministic in ``spec.seed``)."""
    rng = np.random.default_rng(spec.seed)
    probs = np.asarray([p for _, _, p in spec.shapes], dtype=np.float64)
    probs /= probs.sum()
    shape_idx = rng.choice(len(spec.shapes), size=spec.jobs, p=probs)
    work = np.minimum(
        rng.lognormal(math.log(spec.median_work_s), spec.work_sigma, size=spec.jobs),
        spec.max_work_s,
    )
    gpus = np.asarray([m * r / MILLI_PER_GPU for m, r, _ in spec.shapes])[shape_idx]
    rate = spec.load * spec.gpus / float(np.mean(gpus * work))
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=spec.jobs))
    arrivals -= arrivals[0]
    weights = np.asarray([1.0 / (i + 1) for i in range(spec.tenants)])
    weights /= weights.sum()
    tenant_idx = rng.choice(spec.tenants, size=spec.jobs, p=weights)
    prio_p = np.asarray([p for _, _, p in PRIORITY_MIX])
    prio_idx = rng.choice(len(PRIORITY_MIX), size=spec.jobs, p=prio_p / prio_p.sum())
    names = [f"team-{i:02d}" for i in range(spec.tenants)]
    width = len(str(spec.jobs - 1))
    capacity = spec.gpus * MILLI_PER_GPU
    guaranteed = [int(capacity * w) for w in weights]
    jobs = []
    for i in range(spec.jobs):
        milli, replicas, _ = spec.shapes[int(shape_idx[i])]
        prio, preemptible, _ = PRIORITY_MIX[int(prio_idx[i])]
        preemptible = preemptible or milli * replicas > guaranteed[int(tenant_idx[i])]
        jobs.append(
            TraceJob(
                id=f"job-{i:0{width}d}",
                tenant=names[int(tenant_idx[i])],
                submit_time=round(float(arrivals[i]), 3),
                work_s=round(float(work[i]), 3),
                gpu_milli=milli,
                replicas=replicas,
                cpu_milli=1000 * max(1, milli // MILLI_PER_GPU),
                priority_class=prio,
                preemptible=preemptible,
            )
        )
    tenants = tuple(Tenant(n, fair_share=float(w)) for n, w in zip(names, weights, strict=True))
    quotas = tuple(
        Quota(tenant=n, pool=DEFAULT_POOL, guaranteed_milli=g)
        for n, g in zip(names, guaranteed, strict=True)
    )
    return Workload(
        f"synthetic ({spec.jobs} jobs, load {spec.load:g}, seed {spec.seed})",
        tuple(jobs),
        tenants=tenants,
        quotas=quotas,
    )
