"""What a replay consumes: a cluster and a workload of timed jobs, independent of their source.

Every trace adapter (Alibaba, Philly-derived, synthetic) turns its files into these two values,
so the engine never knows where a trace came from.

Words:

- **trace job** (:class:`TraceJob`): one job of a trace: when it arrives (``submit_time``,
  seconds from the trace start), how much work it needs (``work_s``: seconds of running at full
  speed on what it asked for), and what it asks for (per replica, in gpupool's integer units).
- **work** is what a job must accumulate to finish. A preemption loses the work done since the
  job's last checkpoint; the job then needs that much again.
- **cluster** (:class:`SimCluster`): nodes and devices as domain values, the same types the
  control plane hands the scheduler.
- **workload** (:class:`Workload`): trace jobs sorted by submit time, the tenants (with their
  quotas where the source defines them) and a note of what the adapter left out and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpupool.domain.nodes import Device, Node
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.tenants import Quota, Tenant
from gpupool.domain.units import MILLI_PER_GPU


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace.

    ``gpu_milli`` is per replica, as in :class:`~gpupool.domain.resources.ResourceRequest`
    (a fraction of one device below 1000, whole devices above). ``gpu_types`` empty means any
    model. ``work_s`` is seconds of work; ``submit_time`` seconds from the trace start.
    """

    id: str
    tenant: str
    submit_time: float
    work_s: float
    gpu_milli: int
    replicas: int = 1
    cpu_milli: int = 0
    host_memory_mib: int = 0
    gpu_memory_mib: int | None = None
    gpu_types: tuple[str, ...] = ()
    priority_class: str = "normal"
    preemptible: bool = False

    def __post_init__(self) -> None:
        if self.work_s < 0 or self.submit_time < 0:
            raise ValueError(f"job {self.id}: submit time and work must be >= 0")
        if self.replicas < 1:
            raise ValueError(f"job {self.id}: replicas must be at least 1")

    @property
    def resources(self) -> ResourceRequest:
        return ResourceRequest(
            gpu_milli=self.gpu_milli,
            gpu_memory_mib=self.gpu_memory_mib,
            gpu_types=self.gpu_types,
            cpu_milli=self.cpu_milli,
            host_memory_mib=self.host_memory_mib,
        )

    @property
    def total_gpu_milli(self) -> int:
        """milli-GPU over all replicas."""
        return self.gpu_milli * self.replicas

    def rounded_up(self) -> TraceJob:
        """The job as a team without pooling runs it: a fraction becomes one whole GPU.

        GPU memory follows (a whole device's memory), so the exclusive baseline never shares.
        """
        if 0 < self.gpu_milli < MILLI_PER_GPU:
            return replace(self, gpu_milli=MILLI_PER_GPU, gpu_memory_mib=None)
        return self


@dataclass(frozen=True)
class SimCluster:
    """The simulated machines. ``name`` says where they came from (for reports)."""

    name: str
    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]

    @property
    def gpu_count(self) -> int:
        return len(self.devices)

    @property
    def capacity_milli(self) -> int:
        return len(self.devices) * MILLI_PER_GPU


@dataclass(frozen=True)
class Workload:
    """Trace jobs sorted by ``(submit_time, id)``, tenants, quotas and what was left out.

    ``skipped`` maps a reason (``"never ran"``) to how many source records it excluded;
    ``notes`` are what the adapter wants the reader told (a bad row quoted, names changed).
    """

    name: str
    jobs: tuple[TraceJob, ...]
    tenants: tuple[Tenant, ...] = ()
    quotas: tuple[Quota, ...] = ()
    skipped: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.jobs, key=lambda j: (j.submit_time, j.id)))
        object.__setattr__(self, "jobs", ordered)
        object.__setattr__(self, "skipped", dict(self.skipped))  # a plain dict pickles
        ids = {j.id for j in ordered}
        if len(ids) != len(ordered):
            raise ValueError(f"workload {self.name}: job ids are not unique")
        if not self.tenants:
            names = sorted({j.tenant for j in ordered})
            object.__setattr__(self, "tenants", tuple(Tenant(n) for n in names))

    @property
    def tenant_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tenants)

    def demand_gpu_seconds(self) -> float:
        """GPU-seconds the workload needs with no preemption (whole GPUs = 1 per second)."""
        return sum(j.total_gpu_milli * j.work_s for j in self.jobs) / MILLI_PER_GPU


def uniform_cluster(
    gpus: int, model: str, gpus_per_node: int, memory_mib: int = 81920
) -> SimCluster:
    """``gpus`` devices of one ``model`` on machines of ``gpus_per_node`` (the last one the
    remainder), each machine with 16 CPUs and 128 GiB of host memory per GPU."""
    nodes: list[Node] = []
    devices: list[Device] = []
    left = gpus
    while left > 0:
        count = min(gpus_per_node, left)
        name = f"node-{len(nodes):04d}"
        nodes.append(Node(name, cpu_milli=count * 16000, memory_mib=count * 131072))
        devices.extend(Device(f"{name}/gpu{i}", name, i, model, memory_mib) for i in range(count))
        left -= count
    return SimCluster(f"{gpus} x {model}", tuple(nodes), tuple(devices))


def equal_quotas(workload: Workload, cluster: SimCluster, pool: str = "default") -> Workload:
    """Give every tenant an equal guaranteed share of the cluster, no limit.

    This is what "pooling the GPUs the teams own" means when a trace does not say who owns
    what: each team is guaranteed its part and may borrow the idle rest (reclaimably).
    """
    names = workload.tenant_names
    if not names:
        return workload
    share = cluster.capacity_milli // len(names)
    quotas = tuple(Quota(tenant=n, pool=pool, guaranteed_milli=share) for n in names)
    return replace(workload, quotas=quotas)


def trace_name(base: str, *, shares: bool, time_scale: float) -> str:
    """A workload's name: the trace's, with what the adapter changed (shares, time scale)."""
    if shares:
        base += " + Alibaba shares"
    if time_scale != 1:
        base += f" (times / {time_scale:g})"
    return base


def gang(gpus: int, per_node: int) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a job of ``gpus`` GPUs on ``per_node``-GPU machines."""
    if gpus <= per_node:
        return 1, gpus
    for replicas in range(-(-gpus // per_node), gpus + 1):
        if gpus % replicas == 0:
            return replicas, gpus // replicas
    return gpus, 1  # pragma: no cover - replicas == gpus always divides
