"""Scheduler throughput on the Alibaba GPU cluster (trace v2023).

One scheduling cycle (``gpupool.scheduling.schedule``) over the 1,213 GPU nodes (6,212 GPUs) of
``openb_node_list_gpu_node.csv`` with N pending jobs (default 10,000) drawn with a fixed seed,
with replacement, from ``openb_pod_list_default.csv``. Nothing runs at the start; the cycle
places what fits and gives every other job a reason and an estimate. For each registered
placement policy it prints the time of one full cycle (median of ``--repeat`` runs), the
replicas placed, placements per second (replicas placed / cycle time), the same per second of
the process's CPU time (less disturbed by other work on a shared machine) and the process's
peak RSS. ``--json`` prints the same figures as JSON.

``--context-reserve MIB`` makes every node register as one that does not offer the CUDA shim
(modes ``exclusive``, ``soft``) with that context reserve on each GPU, so each sharing job
(isolation ``auto``) keeps a context of headroom per replica: the packing path with headroom
arrays (see ``gpupool.scheduling.layout``). Without it nodes register no modes and no headroom
is kept, as before.

    .venv/bin/python benchmarks/bench_scheduler.py [--jobs 10000] [--repeat 3] [--json]
        [--context-reserve 768]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.nodes import Device, Node
from gpupool.domain.pools import Pool
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.tenants import Tenant
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.placement.registry import DEFAULT_POLICY, policy_names
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.sim.alibaba import read_nodes, read_pods

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023" / "csv"

# GPU memory per model (MiB). The node list gives no GPU memory; these are the cards' sizes
# (G2/G3 are anonymised models; 32 GiB is assumed). Pods ask for no GPU memory, so they get
# the share of memory that matches their compute share.
MODEL_MEMORY = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 32768,
    "G3": 32768,
}
TENANTS = ("team-a", "team-b", "team-c", "team-d")


def build_snapshot(
    data: Path, n_jobs: int, seed: int, reserve: int | None = None
) -> ClusterSnapshot:
    nodes: list[Node] = []
    devices: list[Device] = []
    for rec in read_nodes(data / "openb_node_list_gpu_node.csv"):
        modes = None if reserve is None else ("exclusive", "soft")
        nodes.append(Node(rec.name, rec.cpu_milli, rec.memory_mib, isolation_modes=modes))
        for i in range(rec.gpu_count):
            model = rec.model or "unknown"
            devices.append(
                Device(
                    uuid=f"{rec.name}-gpu{i}",
                    node=rec.name,
                    index=i,
                    model=model,
                    memory_mib=MODEL_MEMORY.get(model, 16384),
                    context_reserve_mib=reserve,
                )
            )
    pods = read_pods(data / "openb_pod_list_default.csv")
    rng = random.Random(seed)
    jobs: list[Job] = []
    for i in range(n_jobs):
        pod = rng.choice(pods)
        milli = pod.gpu_milli if pod.num_gpu == 1 else pod.num_gpu * 1000
        spec = JobSpec(
            name=pod.name,
            command=("true",),
            resources=ResourceRequest(
                gpu_milli=milli if pod.num_gpu else 0,
                gpu_types=pod.gpu_spec or (),
                cpu_milli=pod.cpu_milli,
                host_memory_mib=pod.memory_mib,
            ),
        )
        tenant = TENANTS[i % len(TENANTS)]
        jobs.append(
            Job(
                id=f"job-{i:05d}",
                spec=spec,
                tenant=tenant,
                user="bench",
                priority=500,
                submit_time=float(i),
                eligible_time=float(i),
            )
        )
    return ClusterSnapshot(
        now=float(n_jobs),
        nodes=tuple(nodes),
        devices=tuple(devices),
        pending=tuple(jobs),
        pools=(Pool("default"),),
        tenants=tuple(Tenant(t) for t in TENANTS),
        usage={t: 1e6 * (k + 1) for k, t in enumerate(TENANTS)},
    )


def measure(snapshot: ClusterSnapshot, policy: str, repeat: int) -> dict[str, float]:
    config = SchedulerConfig(default_placement=policy)
    times: list[float] = []
    cpu: list[float] = []
    placed = 0
    started = 0
    memo = SchedulerMemo()  # as a loop keeps one: repeats after the first reuse the layout
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        decision = schedule(snapshot, config, memo)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        placed = sum(len(s.replicas) for s in decision.starts)
        started = len(decision.starts)
    cycle = statistics.median(times)
    cycle_cpu = statistics.median(cpu)
    return {
        "cycle_s": round(cycle, 3),
        "cycle_cpu_s": round(cycle_cpu, 3),
        "jobs_started": started,
        "replicas_placed": placed,
        "placements_per_s": round(placed / cycle, 1) if cycle > 0 else 0.0,
        "placements_per_cpu_s": round(placed / cycle_cpu, 1) if cycle_cpu > 0 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--policy", action="append", help="only these policies (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--context-reserve",
        type=int,
        metavar="MIB",
        help="nodes without the shim, this context reserve per GPU (headroom per sharing job)",
    )
    args = parser.parse_args(argv)
    if not (args.data / "openb_node_list_gpu_node.csv").is_file():
        print(f"Alibaba trace not found in {args.data}: pass --data DIR", file=sys.stderr)
        return 2
    snapshot = build_snapshot(args.data, args.jobs, args.seed, args.context_reserve)
    policies = args.policy or list(policy_names())
    results = {p: measure(snapshot, p, args.repeat) for p in policies}
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {
        "cluster": {"nodes": len(snapshot.nodes), "gpus": len(snapshot.devices)},
        "pending_jobs": len(snapshot.pending),
        "default_policy": DEFAULT_POLICY,
        "policies": results,
        "peak_rss_mib": round(peak_mib, 1),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['cluster']['nodes']} nodes, {report['cluster']['gpus']} GPUs, "
        f"{len(snapshot.pending)} pending jobs; median of {args.repeat} cycles"
    )
    print(
        f"{'policy':<20} {'cycle_s':>8} {'cpu_s':>7} {'started':>8} {'placed':>8} "
        f"{'placements/s':>13} {'per cpu-s':>10}"
    )
    for name, r in results.items():
        mark = " (default)" if name == DEFAULT_POLICY else ""
        print(
            f"{name + mark:<20} {r['cycle_s']:>8.3f} {r['cycle_cpu_s']:>7.3f} "
            f"{r['jobs_started']:>8} {r['replicas_placed']:>8} {r['placements_per_s']:>13.1f} "
            f"{r['placements_per_cpu_s']:>10.1f}"
        )
    print(f"peak RSS: {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
