"""Time-driven replay speed: wall time, cycles, and the share spent inside ``schedule()``.

Workloads (``--workload``):

- ``alibaba``: the full Alibaba v2023 default pod list (8,152 pods, 7,255 that ran) on its
  1,213-node cluster (6,212 GPUs), as recorded (``--time-scale`` compresses arrivals);
- ``synthetic``: ``--jobs`` (default 100,000) Poisson jobs on 1,000 GPUs at load 0.9;
- ``philly``: Gavel's 15 Philly-derived traces on 500 V100s, run times from Philly.

Each scenario is replayed in this process, with ``schedule`` wrapped to add up the seconds
spent inside it, so the table separates the scheduler's time from the simulator's. ``--out DIR``
also writes the replay report (JSON) and its plots there. Wall times are of this machine and
whatever else runs on it: quote medians of several runs.

    .venv/bin/python benchmarks/bench_replay.py --workload alibaba [--scenario exclusive]
        [--min-cycle-interval 30] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import sys
from pathlib import Path

from gpupool.control.machinery.clock import SystemClock
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.sim.metrics import summarise
from gpupool.sim.replay import ReplayOptions, replay
from gpupool.sim.report import report_dict, write_json, write_plots
from gpupool.sim.scenarios import get_scenario
from gpupool.sim.trace_alibaba import alibaba_cluster, alibaba_workload
from gpupool.sim.trace_philly import philly_cluster, philly_workload
from gpupool.sim.trace_synthetic import SyntheticSpec, synthetic_cluster, synthetic_workload
from gpupool.sim.workload import SimCluster, Workload

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def cpu_seconds() -> float:
    """CPU seconds this process has used (user + system): less disturbed by other work on a
    shared machine than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load(args: argparse.Namespace) -> tuple[Workload, SimCluster]:
    if args.workload == "alibaba":
        csv = DATA / "alibaba-gpu-v2023" / "csv"
        return (
            alibaba_workload(csv / "openb_pod_list_default.csv", time_scale=args.time_scale),
            alibaba_cluster(csv / "openb_node_list_gpu_node.csv"),
        )
    if args.workload == "philly":
        return (
            philly_workload(
                DATA / "gavel-philly-derived" / "seed=0",
                DATA / "philly" / "philly_runtime.csv",
                time_scale=args.time_scale,
            ),
            philly_cluster(DATA / "gavel-philly-derived" / "cluster_specs.json"),
        )
    spec = SyntheticSpec(jobs=args.jobs, gpus=1000, load=0.9, seed=0)
    return synthetic_workload(spec), synthetic_cluster(spec)


def combine(folders: list[Path], out: Path, prefix: str) -> None:
    """One report (JSON, plots, markdown table) over runs made in separate processes."""
    from rich.console import Console

    from gpupool.sim.report import comparison_table, tenant_table

    results = []
    for folder in folders:
        with (folder / "results.pickle").open("rb") as handle:
            results.extend(pickle.load(handle))
    summaries = [summarise(r) for r in results]
    out.mkdir(parents=True, exist_ok=True)
    write_plots(out, results, prefix=prefix)
    write_json(out / f"{prefix}-report.json", report_dict(summaries, results, {}))
    console = Console(width=160)
    console.print(comparison_table(summaries))
    console.print(tenant_table(summaries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("alibaba", "synthetic", "philly"), default="alibaba")
    parser.add_argument("--scenario", action="append", default=None)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--min-cycle-interval", type=float, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=None,
        help="plot and tabulate the results.pickle of earlier --out folders together into --out",
    )
    args = parser.parse_args()
    if args.combine:
        combine(args.combine, args.out or Path("."), args.workload)
        return
    clock = SystemClock()
    began = clock.monotonic()
    workload, cluster = load(args)
    load_s = clock.monotonic() - began
    rows = []
    results = []
    for name in args.scenario or ["exclusive", "pooled"]:
        inside = [0.0]

        def timed(
            snapshot: ClusterSnapshot,
            config: SchedulerConfig,
            memo: SchedulerMemo,
            inside: list[float] = inside,
        ) -> Decision:
            t0 = clock.monotonic()
            decision = schedule(snapshot, config, memo)
            inside[0] += clock.monotonic() - t0
            return decision

        options = ReplayOptions(min_cycle_interval_s=args.min_cycle_interval)
        t0, cpu0 = clock.monotonic(), cpu_seconds()
        result = replay(workload, cluster, get_scenario(name), options, schedule=timed)
        wall, cpu = clock.monotonic() - t0, cpu_seconds() - cpu0
        results.append(result)
        rows.append(
            {
                "workload": workload.name,
                "scenario": name,
                "jobs": len(workload.jobs),
                "gpus": cluster.gpu_count,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "schedule_s": round(inside[0], 2),
                "simulator_s": round(wall - inside[0], 2),
                "cycles": result.cycles,
                "events": result.events,
                "ms_per_cycle_in_schedule": round(1000 * inside[0] / max(1, result.cycles), 2),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        summaries = [summarise(r) for r in results]
        write_json(args.out / "report.json", report_dict(summaries, results, {"bench": rows}))
        write_plots(args.out, results, prefix=args.workload)
        # The results themselves, so runs made in separate processes can be plotted together.
        with (args.out / "results.pickle").open("wb") as handle:
            pickle.dump(results, handle)
    if args.json:
        print(
            json.dumps({"load_s": round(load_s, 2), "peak_rss_mib": round(peak_mib), "runs": rows})
        )
        return
    print(f"loaded {workload.name} in {load_s:.1f} s; peak RSS {peak_mib:.0f} MiB")
    print(
        "| scenario | jobs | GPUs | wall s | CPU s | in schedule() s | simulator s | cycles "
        "| ms/cycle in schedule() |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['jobs']} | {r['gpus']} | {r['wall_s']} | {r['cpu_s']} "
            f"| {r['schedule_s']} "
            f"| {r['simulator_s']} | {r['cycles']} | {r['ms_per_cycle_in_schedule']} |"
        )


if __name__ == "__main__":
    main()
