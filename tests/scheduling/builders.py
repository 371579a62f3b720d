"""Builders for scheduler test data: a cluster, its tenants and a queue, in a few readable lines.

    snap = (
        SnapshotBuilder(now=1000)
        .node("n1", gpus=4, model="A100")
        .quota("team-a", guaranteed=1000)
        .job("j1", gpus=0.5, tenant="team-a")
        .run("r1", node="n1", devices=[0], milli=500, tenant="team-b", preemptible=True)
        .build()
    )

Devices are named ``<node>-gpu<i>``. GPU amounts take what people type (``0.5``, ``"50%"``,
``2``) or integer milli through ``milli=``. Memory in MiB unless given as text (``"10GiB"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.nodes import Device, DeviceHealth, Node, NodeState
from gpupool.domain.pools import Pool
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES, Quota, Tenant
from gpupool.domain.units import parse_gpus, parse_memory
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica

A100_MIB = 81920


def uuid(node: str, index: int) -> str:
    return f"{node}-gpu{index}"


def _mib(value: int | str | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    return parse_memory(value)


@dataclass
class SnapshotBuilder:
    """Collects nodes, devices, tenants, quotas, pending and running jobs; ``build()`` freezes."""

    now: float = 1000.0
    nodes: list[Node] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    running: list[RunningReplica] = field(default_factory=list)
    pending: list[Job] = field(default_factory=list)
    pools: dict[str, Pool] = field(default_factory=lambda: {"default": Pool("default")})
    tenants: dict[str, Tenant] = field(default_factory=dict)
    quotas: list[Quota] = field(default_factory=list)
    usage: dict[str, float] = field(default_factory=dict)
    budget_used: dict[tuple[str, str], float] = field(default_factory=dict)
    _seq: int = 0

    def node(
        self,
        name: str,
        *,
        gpus: int = 4,
        model: str = "A100",
        memory_mib: int = A100_MIB,
        cpus: int = 64,
        host_memory: int | str = "512GiB",
        pool: str = "default",
        nvlink: Sequence[int | None] | None = None,
        unhealthy: Sequence[int] = (),
        state: NodeState = NodeState.UP,
    ) -> SnapshotBuilder:
        self.nodes.append(Node(name, cpus * 1000, _mib(host_memory) or 0, state))
        for i in range(gpus):
            self.devices.append(
                Device(
                    uuid=uuid(name, i),
                    node=name,
                    index=i,
                    model=model,
                    memory_mib=memory_mib,
                    pool=pool,
                    nvlink_group=None if nvlink is None else nvlink[i],
                    health=DeviceHealth.UNHEALTHY if i in unhealthy else DeviceHealth.HEALTHY,
                )
            )
        if pool not in self.pools:
            self.pools[pool] = Pool(pool)
        return self

    def pool(
        self, name: str, *, overcommit: float = 1.0, placement: str = "default"
    ) -> SnapshotBuilder:
        self.pools[name] = Pool(name, placement=placement, memory_overcommit=overcommit)
        return self

    def tenant(self, name: str, *, fair_share: float = 1.0, usage: float = 0.0) -> SnapshotBuilder:
        self.tenants[name] = Tenant(name, fair_share)
        if usage:
            self.usage[name] = usage
        return self

    def quota(
        self,
        tenant: str,
        *,
        pool: str = "default",
        guaranteed: int = 0,
        limit: int | None = None,
        guaranteed_memory: int = 0,
        limit_memory: int | None = None,
        budget: float | None = None,
        budget_used: float = 0.0,
    ) -> SnapshotBuilder:
        """Quota amounts in milli-GPU (``guaranteed=1000`` is one GPU) and MiB."""
        self.quotas.append(
            Quota(
                tenant,
                pool,
                guaranteed_milli=guaranteed,
                limit_milli=limit,
                guaranteed_memory_mib=guaranteed_memory,
                limit_memory_mib=limit_memory,
                gpu_hour_budget=budget,
            )
        )
        if budget_used:
            self.budget_used[(tenant, pool)] = budget_used
        return self

    def job(
        self,
        job_id: str,
        *,
        gpus: float | str | int = 1,
        milli: int | None = None,
        memory: int | str | None = None,
        gpu_types: Sequence[str] = (),
        cpus: int = 1,
        host_memory: int | str = 0,
        tenant: str = "team-a",
        pool: str = "default",
        priority: int = 500,
        replicas: int = 1,
        preemptible: bool = False,
        submit: float | None = None,
        eligible: float | None = None,
        expected: float | None = None,
        time_limit: float | None = None,
        held: bool = False,
    ) -> SnapshotBuilder:
        gpu_milli = milli if milli is not None else parse_gpus(gpus)
        self._seq += 1
        submit_time = float(self._seq) if submit is None else submit
        spec = JobSpec(
            name=job_id,
            command=("true",),
            tenant=tenant,
            pool=pool,
            resources=ResourceRequest(
                gpu_milli=gpu_milli,
                gpu_memory_mib=_mib(memory),
                gpu_types=tuple(gpu_types),
                cpu_milli=cpus * 1000,
                host_memory_mib=_mib(host_memory) or 0,
            ),
            replicas=replicas,
            preemptible=preemptible,
            expected_duration_s=expected,
            time_limit_s=time_limit,
        )
        self.pending.append(
            Job(
                id=job_id,
                spec=spec,
                tenant=tenant,
                user="u",
                priority=priority,
                submit_time=submit_time,
                eligible_time=submit_time if eligible is None else eligible,
                held=held,
            )
        )
        return self

    def run(
        self,
        job_id: str,
        *,
        node: str,
        devices: Sequence[int] = (0,),
        milli: int = 1000,
        memory: int | str | None = None,
        tenant: str = "team-b",
        pool: str = "default",
        priority: int = 500,
        preemptible: bool = False,
        start: float = 0.0,
        expected_end: float | None = None,
        checkpoint: float | None = None,
        cpus: int = 1,
        host_memory: int | str = 0,
        replica: int = 0,
        borrowing: bool | None = None,
        preempted_for: str | None = None,
        grace: float = 30.0,
    ) -> SnapshotBuilder:
        """A running replica on ``node``'s device indexes ``devices`` (memory default: share)."""
        mem = _mib(memory)
        if mem is None:
            model_mem = next(d.memory_mib for d in self.devices if d.node == node)
            mem = model_mem * milli // 1000
        self.running.append(
            RunningReplica(
                job_id=job_id,
                replica=replica,
                node=node,
                devices=tuple(uuid(node, i) for i in devices),
                milli_per_device=milli,
                memory_per_device_mib=mem,
                tenant=tenant,
                pool=pool,
                priority=priority,
                preemptible=preemptible,
                start_time=start,
                expected_end=expected_end,
                last_checkpoint_time=checkpoint,
                cpu_milli=cpus * 1000,
                host_memory_mib=_mib(host_memory) or 0,
                borrowing=borrowing,
                grace_period_s=grace,
                preempted_for=preempted_for,
            )
        )
        return self

    def build(self) -> ClusterSnapshot:
        tenants = dict(self.tenants)
        for job in self.pending:
            tenants.setdefault(job.tenant, Tenant(job.tenant))
        for replica in self.running:
            tenants.setdefault(replica.tenant, Tenant(replica.tenant))
        return ClusterSnapshot(
            now=self.now,
            nodes=tuple(self.nodes),
            devices=tuple(self.devices),
            running=tuple(self.running),
            pending=tuple(self.pending),
            pools=tuple(self.pools.values()),
            tenants=tuple(tenants.values()),
            quotas=tuple(self.quotas),
            priority_classes=DEFAULT_PRIORITY_CLASSES,
            usage=dict(self.usage),
            budget_used=dict(self.budget_used),
        )
