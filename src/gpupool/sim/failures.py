"""Node failure injection: when machines break, drawn reproducibly.

Each node fails as a Poisson process with mean time between failures ``mtbf_s`` (counted
from when it is back up) and stays down ``repair_s`` seconds. Failures are drawn over
``[0, horizon_s)`` from one seeded generator, node by node in cluster order, so the same
cluster, rates and seed always break the same machines at the same times.
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.replay import NodeFailure
from gpupool.sim.workload import SimCluster


def random_failures(
    cluster: SimCluster, *, mtbf_s: float, repair_s: float, horizon_s: float, seed: int = 0
) -> tuple[NodeFailure, ...]:
    """Failures of every node of ``cluster`` before ``horizon_s`` (see the module docstring)."""
    if mtbf_s <= 0 or repair_s < 0 or horizon_s < 0:
        raise ValueError("mtbf must be above 0 and repair time and horizon at least 0")
    rng = np.random.default_rng(seed)
    failures: list[NodeFailure] = []
    for node in cluster.nodes:
        t = float(rng.exponential(mtbf_s))
        while t < horizon_s:
            failures.append(NodeFailure(node.name, round(t, 3), repair_s))
            t += repair_s + float(rng.exponential(mtbf_s))
    return tuple(sorted(failures, key=lambda f: (f.at, f.node)))
