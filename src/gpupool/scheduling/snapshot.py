"""The scheduler's input: one frozen picture of the cluster at ``now``.

The caller (the control loop, the simulator, a test) builds a :class:`ClusterSnapshot`; the
scheduler reads it and never looks anywhere else. Nothing in a snapshot is live: it holds
plain values, so the same snapshot always gives the same decision.

Words:

- **device capacity** comes from :attr:`ClusterSnapshot.devices` (physical memory, model, pool,
  health, NVLink group). **Free** capacity is not stored: the scheduler derives it from the
  devices minus what :attr:`ClusterSnapshot.running` holds, so the two can never disagree.
- a **running replica** (:class:`RunningReplica`) is one replica of a running job with the
  slices it holds: the same GPU share and memory on each of its devices.
- **borrowing**: a running job that holds capacity above its tenant's guaranteed quota in its
  pool; it may be reclaimed. ``None`` lets the admission stage work it out (the tenant's jobs
  started last are the ones above the guarantee).
- **stopping**: a replica with a stop order (``stop_ordered``: cancelled, preempted, its gang or
  node lost...) or already being preempted (``preempted_for`` names the job it makes room for).
  Its slices still count as taken until it is gone; it is never chosen as a victim again, and
  the job it stops for waits instead of preempting more.
- **usage**: a tenant's half-life-decayed usage in milli-GPU·seconds, computed by the caller
  (the scheduler reads no clock and keeps no history).
- **budget used**: GPU-hours a tenant used in a pool in the current budget window.

A device should be listed either as the whole GPU or as its MIG instances, not both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from gpupool.domain.jobs import Job
from gpupool.domain.nodes import Device, Node
from gpupool.domain.pools import DEFAULT_POOL, Pool
from gpupool.domain.tenants import DEFAULT_PRIORITY_CLASSES, PriorityClass, Quota, Tenant


@dataclass(frozen=True)
class RunningReplica:
    """One replica of a running job and the slices it holds.

    ``devices`` are device UUIDs on ``node``; each holds ``milli_per_device`` milli-GPU and
    ``memory_per_device_mib`` MiB of GPU memory (as promised at start, not as measured).
    ``cpu_milli`` and ``host_memory_mib`` are taken on the node. ``expected_end`` is the time
    the job is expected to end (start + expected duration, else start + time limit) or
    ``None`` when unknown. ``last_checkpoint_time`` ``None`` means "never checkpointed": a
    preemption loses everything since ``start_time``. ``grace_period_s`` is how long the job
    takes to stop after its checkpoint signal. ``isolation`` is the mode the node enforced
    (the job's record), else the one the job asked for (``auto``): it says whether the
    replica's CUDA context lies outside its slice, and so takes the GPU's context reserve
    beside it (see :mod:`gpupool.scheduling.layout`).
    """

    job_id: str
    replica: int
    node: str
    devices: tuple[str, ...]
    milli_per_device: int
    memory_per_device_mib: int
    tenant: str
    pool: str = DEFAULT_POOL
    priority: int = 500
    preemptible: bool = False
    start_time: float = 0.0
    expected_end: float | None = None
    last_checkpoint_time: float | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0
    borrowing: bool | None = None
    grace_period_s: float = 30.0
    preempted_for: str | None = None
    stop_ordered: bool = False
    isolation: str = "auto"

    def __post_init__(self) -> None:
        if not 0 <= self.milli_per_device <= 1000:
            raise ValueError(
                f"running replica {self.job_id}/{self.replica}: milli_per_device "
                f"{self.milli_per_device} is outside 0..1000"
            )
        if self.memory_per_device_mib < 0 or self.cpu_milli < 0 or self.host_memory_mib < 0:
            raise ValueError(f"running replica {self.job_id}/{self.replica}: amounts must be >= 0")

    @property
    def stopping(self) -> bool:
        """True when this replica is already stopping (preempted, or any other stop order)."""
        return self.stop_ordered or self.preempted_for is not None

    @property
    def gpu_milli(self) -> int:
        """milli-GPU this replica holds over all its devices."""
        return self.milli_per_device * len(self.devices)

    @property
    def gpu_memory_mib(self) -> int:
        """GPU memory this replica holds over all its devices, in MiB."""
        return self.memory_per_device_mib * len(self.devices)

    def work_since_checkpoint(self, now: float) -> float:
        """Seconds of work a preemption at ``now`` would lose."""
        since = self.start_time if self.last_checkpoint_time is None else self.last_checkpoint_time
        return max(0.0, now - max(since, self.start_time))


def _frozen(mapping: Mapping[object, float]) -> Mapping[object, float]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one scheduling cycle may look at.

    ``pending`` holds the queued jobs (state PENDING, held or not); ``running`` the replicas of
    jobs holding resources. ``pools`` lists every known pool: a job naming another pool waits
    with ``PoolUnknown``. ``quotas`` holds at most one quota per (tenant, pool); a tenant with
    no quota in a pool is *unmanaged* there (never borrowing, never limited).
    ``usage`` maps tenant -> decayed milli-GPU·s; ``budget_used`` maps (tenant, pool) ->
    GPU-hours used in the current budget window (missing = 0).
    """

    now: float
    nodes: tuple[Node, ...] = ()
    devices: tuple[Device, ...] = ()
    running: tuple[RunningReplica, ...] = ()
    pending: tuple[Job, ...] = ()
    pools: tuple[Pool, ...] = (Pool(DEFAULT_POOL),)
    tenants: tuple[Tenant, ...] = ()
    quotas: tuple[Quota, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    usage: Mapping[str, float] = field(default_factory=dict)
    budget_used: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "usage", _frozen(self.usage))  # type: ignore[arg-type]
        object.__setattr__(self, "budget_used", _frozen(self.budget_used))  # type: ignore[arg-type]
        seen: set[tuple[str, str]] = set()
        for quota in self.quotas:
            key = (quota.tenant, quota.pool)
            if key in seen:
                raise ValueError(
                    f"two quotas for tenant {quota.tenant} in pool {quota.pool}: keep one"
                )
            seen.add(key)

    # Lookups, computed once per snapshot (cached_property writes the instance dict directly,
    # which a frozen dataclass allows).

    @cached_property
    def pool_by_name(self) -> Mapping[str, Pool]:
        return MappingProxyType({p.name: p for p in self.pools})

    @cached_property
    def tenant_by_name(self) -> Mapping[str, Tenant]:
        return MappingProxyType({t.name: t for t in self.tenants})

    @cached_property
    def quota_by_key(self) -> Mapping[tuple[str, str], Quota]:
        return MappingProxyType({(q.tenant, q.pool): q for q in self.quotas})

    @cached_property
    def node_by_name(self) -> Mapping[str, Node]:
        return MappingProxyType({n.name: n for n in self.nodes})

    @cached_property
    def running_by_job(self) -> Mapping[str, tuple[RunningReplica, ...]]:
        """Running replicas grouped by job id, replicas in rank order."""
        groups: dict[str, list[RunningReplica]] = {}
        for replica in self.running:
            groups.setdefault(replica.job_id, []).append(replica)
        return MappingProxyType(
            {
                k: (v[0],) if len(v) == 1 else tuple(sorted(v, key=lambda r: r.replica))
                for k, v in groups.items()
            }
        )

    def quota(self, tenant: str, pool: str) -> Quota | None:
        """The tenant's quota in ``pool``, or ``None`` when the tenant is unmanaged there."""
        return self.quota_by_key.get((tenant, pool))

    def fair_share(self, tenant: str) -> float:
        """The tenant's relative fair share (1.0 for tenants the snapshot does not list)."""
        known = self.tenant_by_name.get(tenant)
        return 1.0 if known is None else known.fair_share
