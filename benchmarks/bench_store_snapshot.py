"""The scheduling snapshot read from the store with many replicas running.

A SQLite store (or ``--database-url``, an empty database) with ``--nodes`` nodes of 8 GPUs and
``--jobs`` half-GPU jobs, all placed (so running), then
:func:`gpupool.control.machinery.snapshot.build_snapshot` timed ``--repeat`` times with one
warm ``SpecCache`` and ``ClusterCache``, as the loop keeps them across cycles. Prints the
median and the fastest read (the first, which fills the caches, is left out), the median CPU
time of this process's thread (the database's own is not in it) and the load average.

For before/after figures run it with an older tree first on ``PYTHONPATH``::

    git archive 55f6064 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/bench_store_snapshot.py
    .venv/bin/python benchmarks/bench_store_snapshot.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpupool.control.bootstrap import bootstrap
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.machinery.snapshot import ClusterCache, SpecCache, build_snapshot
from gpupool.control.services.jobs import JobService
from gpupool.control.settings import ServerSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.control.builders import ADMIN, register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--database-url", help="an empty database to fill (default: SQLite in a temporary home)"
    )
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    url = args.database_url or f"sqlite:///{home}/gpupool.db"
    settings = ServerSettings(home=home, database_url=url, schedule=False)
    cp = ControlPlane(settings, clock=ManualClock(1.8e9))
    cp.prepare()
    bootstrap(cp)
    for i in range(args.nodes):
        register(cp, f"n{i}", gpus=8)
    jobs = JobService(cp)
    for i in range(args.jobs):
        spec = {"name": f"j{i}", "command": ["sleep", "1"], "resources": {"gpus": "0.5"}}
        jobs.submit(ADMIN, spec)
    loop = SchedulingLoop(cp)
    if not loop.leadership.try_acquire():
        raise SystemExit("could not take the lease of a fresh store")
    while loop.cycle().started:
        pass
    cache, cluster = SpecCache(), ClusterCache()
    seconds: list[float] = []
    cpu: list[float] = []
    running = 0
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        with cp.read() as s:
            snapshot, _ = build_snapshot(s, cp.now(), cache, cluster)
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        running = len(snapshot.running)
    warm, warm_cpu = seconds[1:] or seconds, cpu[1:] or cpu
    print(
        f"running replicas {running}: snapshot median {statistics.median(warm) * 1000:.1f} ms, "
        f"fastest {min(warm) * 1000:.1f} ms, this process's CPU median "
        f"{statistics.median(warm_cpu) * 1000:.1f} ms (load {os.getloadavg()[0]:.1f})"
    )
    cp.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
