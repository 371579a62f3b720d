"""What one job's supervisor costs to start, and a wave of them through the real executor.

Every replica runs under a fresh ``python -m gpupool.agent.supervisor`` (see
:mod:`gpupool.agent.supervisor`); in the short-job drain of ``bench_live_loop.py`` 40 of them
start at once. Two figures:

- **start CPU**: user + system CPU of ``N`` supervisor processes (started with no folder, so
  they import their modules, print their usage and exit) against ``python -c pass``, the
  interpreter's floor, mean per process;
- **wave**: ``N`` replicas of ``sleep 2`` launched one after the other through
  :class:`gpupool.agent.executor.Executor` (no cgroups) as the agent does: the agent thread's
  wall time per ``launch()`` (the folder's two files and the supervisor's fork), the time from
  the first launch until every replica's ``state.json`` says running, and the supervisors' CPU.

``--src`` runs another checkout's ``src`` (e.g. one made with ``git archive``) for before/after.

    .venv/bin/python benchmarks/bench_supervisor_start.py [--n 40] [--src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

WAVE = """
import json, os, resource, sys, tempfile, time
from pathlib import Path
from gpupool.agent.executor import Executor
from gpupool.agent.jobdir import EXITED, RUNNING, LaunchSpec
n = int(sys.argv[1])
tmp = Path(tempfile.mkdtemp())
ex = Executor(tmp / "state", cgroups=False)
spec = LaunchSpec(argv=["sleep", "2"], env={"PATH": os.environ["PATH"]}, cwd=str(tmp))
t0 = time.monotonic()
for i in range(n):
    ex.launch(f"a{i}", spec, {})
launch_ms = (time.monotonic() - t0) / n * 1000
while any(ex.observe(f"a{i}").status not in (RUNNING, EXITED) for i in range(n)):
    time.sleep(0.005)
running_s = time.monotonic() - t0
while any(ex.observe(f"a{i}").status != EXITED for i in range(n)):
    time.sleep(0.05)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "wave_launch_wall_ms_each": round(launch_ms, 2),
    "wave_all_running_s": round(running_s, 3),
    "wave_children_cpu_ms_each": round((ru.ru_utime + ru.ru_stime) / n * 1000, 1),
}))
"""


def _cpu_ms_each(argv: list[str], n: int, env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        subprocess.run(argv, env=env, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(used / n * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="supervisors (and replicas in a wave)")
    parser.add_argument("--src", help="run another checkout's src")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be 1 or more")
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.path.abspath(args.src)
    py = sys.executable
    result: dict[str, object] = {
        "src": args.src or "this checkout",
        "n": args.n,
        "load1_before": round(os.getloadavg()[0], 2),
        "pass_cpu_ms": _cpu_ms_each([py, "-c", "pass"], args.n, env),
        "supervisor_start_cpu_ms": _cpu_ms_each(
            [py, "-m", "gpupool.agent.supervisor"], args.n, env
        ),
    }
    wave = subprocess.run(
        [py, "-c", WAVE, str(args.n)], env=env, capture_output=True, text=True, check=True
    )
    result.update(json.loads(wave.stdout))
    result["load1_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
