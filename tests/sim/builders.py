"""Small hand-made clusters and workloads for the replay tests."""

from __future__ import annotations

from gpupool.sim.workload import SimCluster, TraceJob, Workload, uniform_cluster


def cluster(gpus: int, per_node: int = 8) -> SimCluster:
    return uniform_cluster(gpus, "A100-80GB", per_node)


def job(
    id: str,
    at: float,
    gpus: float,
    work: float,
    *,
    tenant: str = "team-a",
    priority: str = "normal",
    preemptible: bool = False,
    replicas: int = 1,
) -> TraceJob:
    return TraceJob(
        id=id,
        tenant=tenant,
        submit_time=at,
        work_s=work,
        gpu_milli=round(gpus * 1000),
        replicas=replicas,
        cpu_milli=1000,
        priority_class=priority,
        preemptible=preemptible,
    )


def workload(*jobs: TraceJob) -> Workload:
    return Workload("hand-made", tuple(jobs))
