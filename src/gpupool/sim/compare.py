"""Run several scenarios of one replay, one process each when asked, and time them.

A replay is single-threaded; scenarios are independent, so ``workers > 1`` runs them in
separate processes (the workload and cluster are sent to each). Wall times come from the
injected clock (:class:`~gpupool.control.machinery.clock.SystemClock` by default) and include only
the replay itself. Progress is reported only in-process (``workers == 1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gpupool.control.machinery.clock import Clock, SystemClock
from gpupool.sim.replay import ReplayOptions, ReplayResult, replay
from gpupool.sim.scenarios import Scenario
from gpupool.sim.workload import SimCluster, Workload

#: (scenario name) -> progress callback (done, total)
ProgressFactory = Callable[[str], Callable[[int, int], None] | None]


@dataclass(frozen=True)
class TimedResult:
    """One scenario's result and the wall seconds its replay took."""

    result: ReplayResult
    wall_s: float


def _run_one(
    workload: Workload, cluster: SimCluster, scenario: Scenario, options: ReplayOptions
) -> TimedResult:
    clock = SystemClock()
    began = clock.monotonic()
    result = replay(workload, cluster, scenario, options)
    return TimedResult(result, clock.monotonic() - began)


def run_scenarios(
    workload: Workload,
    cluster: SimCluster,
    scenarios: Sequence[Scenario],
    options: ReplayOptions,
    *,
    workers: int = 1,
    progress: ProgressFactory | None = None,
    clock: Clock | None = None,
) -> list[TimedResult]:
    """Replay ``workload`` under each scenario, in order; results in the same order."""
    if workers > 1 and len(scenarios) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(scenarios))) as pool:
            futures = [pool.submit(_run_one, workload, cluster, sc, options) for sc in scenarios]
            return [f.result() for f in futures]
    clock = clock or SystemClock()
    out = []
    for sc in scenarios:
        began = clock.monotonic()
        callback = progress(sc.name) if progress is not None else None
        result = replay(workload, cluster, sc, options, progress=callback)
        out.append(TimedResult(result, clock.monotonic() - began))
    return out
