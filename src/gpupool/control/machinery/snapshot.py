"""Building the scheduler's :class:`~gpupool.scheduling.snapshot.ClusterSnapshot` from the store.

Read in one transaction, so the picture is consistent. Words:

- **decayed usage** of a tenant: its allocated milli-GPU·seconds, each hour bucket weighted by
  ``2^(-age / half_life)`` (``USAGE_HALF_LIFE_S``, a week), as Slurm's fair-share does.
- **budget used**: whole-GPU hours the tenant used in the pool within its quota's budget window.

Devices on nodes that are down are given health ``unknown``, so nothing is placed on them.
A job whose file names no ``cpus`` gets the default CPU rule here, for its pool's nodes as they
are now (:func:`gpupool.domain.resources.default_cpu_milli`), pending and running alike.
A replica whose assignment has a stop order is *stopping* (``stop_ordered``); when the stop is a
preemption, ``preempted_for`` names the job it makes room for (``assignments.stop_for``).

With thousands of jobs queued, turning each pending row's JSON spec into a
:class:`~gpupool.domain.jobs.JobSpec` (and applying the default CPU rule) was most of a
snapshot's cost, though a queued job's spec rarely changes. The pending rows (and the jobs of
running replicas) are therefore read as plain columns with the spec as its stored text, and
a :class:`SpecCache` (kept by the loop across cycles) maps that text, and the pool's CPUs per
GPU, to the parsed spec: the one typed reader of specs here. The key is the text itself, not
the row's version: an edit that changes the spec without a new version still misses the cache.
The same holds for the cluster itself: a fleet of a thousand nodes of 8 GPUs is 9,000 rows
that rarely change, and making an ORM object and then a domain object of each, every cycle, was
most of a busy cycle's cost (half a second on PostgreSQL under load). They are read as plain
columns (a device's telemetry, rewritten every second, left out), and a :class:`ClusterCache`
(also kept by the loop) maps each row's values to the ``Node`` or ``Device`` made from them:
a row that changed in any column read misses and is made afresh. Unchanged rows give the same
objects cycle after cycle, which the scheduler's memo (``scheduling/memo.py``) finds by
identity.
What the snapshot read of each pending row (``PendingRead``: its version, its stored pending
reason and start estimate) goes back to the commit, which checks the version of a
start and writes only the reasons and estimates that changed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, NamedTuple, TypeVar

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from gpupool.domain.arrays import ArrayTask
from gpupool.domain.assignments import AssignmentState, StopPolicy
from gpupool.domain.jobs import IsolationMode, Job, JobSpec
from gpupool.domain.nodes import Device, DeviceHealth, Node, NodeState
from gpupool.domain.resources import cpu_per_gpu_by_pool, with_default_cpu
from gpupool.domain.states import JobState
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.scheduling.snapshot import ClusterSnapshot, RunningReplica
from gpupool.store.mapping import (
    DEVICE_COLUMNS,
    device_from_values,
    node_from_values,
    pool_from_row,
    priority_class_from_row,
    quota_from_row,
    spec_from_json,
    tenant_from_row,
)
from gpupool.store.models import (
    AssignmentModel,
    DeviceModel,
    JobModel,
    NodeModel,
    PoolModel,
    PriorityClassModel,
    QuotaModel,
    SliceModel,
    TenantModel,
    UsageModel,
)

USAGE_HALF_LIFE_S = 7 * 86400.0

K = TypeVar("K")
V = TypeVar("V")


def _usage(
    s: Session, now: float, quotas: list[QuotaModel]
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    horizon = now - 4 * USAGE_HALF_LIFE_S
    windows = {(q.tenant, q.pool): q.budget_window_s for q in quotas if q.gpu_hour_budget}
    longest = max(windows.values(), default=0.0)
    since = min(horizon, now - longest)
    usage: dict[str, float] = defaultdict(float)
    budget: dict[tuple[str, str], float] = defaultdict(float)
    rows = s.execute(
        select(
            UsageModel.tenant, UsageModel.pool, UsageModel.bucket_start, UsageModel.milli_seconds
        ).where(UsageModel.bucket_start >= since)
    )
    for tenant, pool, bucket, milli_s in rows:
        age = max(0.0, now - bucket)
        usage[tenant] += milli_s * math.pow(2.0, -age / USAGE_HALF_LIFE_S)
        window = windows.get((tenant, pool))
        if window is not None and bucket >= now - window:
            budget[(tenant, pool)] += milli_s / MILLI_PER_GPU / 3600.0
    return dict(usage), dict(budget)


def decayed_usage(s: Session, now: float) -> dict[str, float]:
    """Each tenant's decayed usage in milli-GPU·seconds, as the scheduler sees it."""
    return _usage(s, now, [])[0]


class PendingRead(NamedTuple):
    """What the snapshot read of one pending job's row, for the commit."""

    version: int
    pending_reason: str | None
    estimated_start: float | None


class UsedOnly(Generic[K, V]):
    """Values made from their keys, kept while snapshots use them: an entry no snapshot used
    is dropped at that snapshot's end, so the memo holds at most what the store holds now."""

    def __init__(self, make: Callable[[K], V]) -> None:
        self._make = make
        self._found: dict[K, V] = {}
        self._used: set[K] = set()
        self.made = 0  # values made (for tests and benchmarks)

    def get(self, key: K) -> V:
        self._used.add(key)
        found = self._found.get(key)
        if found is None:
            self.made += 1
            found = self._found[key] = self._make(key)
        return found

    def end_snapshot(self) -> None:
        # Every entry used (the usual case) needs no pass over the thousands of keys.
        if len(self._found) > len(self._used):
            self._found = {k: self._found[k] for k in self._used}
        self._used = set()


def _parse_spec(key: tuple[str, int | None]) -> tuple[JobSpec, ArrayTask | None]:
    text, cpu_per_gpu = key
    data = json.loads(text)
    spec = spec_from_json(data)
    res = with_default_cpu(spec.resources, cpu_per_gpu)
    if res is not spec.resources:
        spec = replace(spec, resources=res)
    array = ArrayTask(**data["array"]) if data.get("array") else None
    return spec, array


class SpecCache:
    """Parsed specs of pending jobs, by their stored JSON text and their pool's CPUs per GPU
    (the default CPU rule depends on it), kept while snapshots use them (:class:`UsedOnly`):
    at most the specs of the jobs queued now."""

    def __init__(self) -> None:
        self._specs = UsedOnly(_parse_spec)

    @property
    def misses(self) -> int:
        """Specs parsed (for tests and benchmarks)."""
        return self._specs.made

    def get(self, text: str, cpu_per_gpu: int | None) -> tuple[JobSpec, ArrayTask | None]:
        """The spec stored as ``text``, with the default CPU rule for ``cpu_per_gpu``."""
        return self._specs.get((text, cpu_per_gpu))

    def end_snapshot(self) -> None:
        self._specs.end_snapshot()


_NODE_COLUMNS = (
    NodeModel.name,
    NodeModel.cpu_milli,
    NodeModel.memory_mib,
    NodeModel.state,
    cast(NodeModel.labels, Text),
    cast(NodeModel.isolation_modes, Text),
    cast(NodeModel.features, Text),
)


def _json_or_none(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def _make_node(values: tuple[Any, ...]) -> Node:
    name, cpu, mem, state, labels, modes, features = values
    return node_from_values(
        name,
        cpu_milli=cpu,
        memory_mib=mem,
        state=state,
        labels=_json_or_none(labels),
        isolation_modes=_json_or_none(modes),
        features=_json_or_none(features),
    )


class ClusterCache:
    """Nodes and devices made from their rows, keyed by the values read (``_NODE_COLUMNS``,
    ``DEVICE_COLUMNS``), kept while snapshots use them (:class:`UsedOnly`): at most the
    cluster as it is now."""

    def __init__(self) -> None:
        self.nodes: UsedOnly[tuple[Any, ...], Node] = UsedOnly(_make_node)
        self.devices: UsedOnly[tuple[Any, ...], Device] = UsedOnly(device_from_values)

    @property
    def made(self) -> int:
        """Nodes and devices made from their rows (for tests and benchmarks)."""
        return self.nodes.made + self.devices.made

    def end_snapshot(self) -> None:
        self.nodes.end_snapshot()
        self.devices.end_snapshot()


_PENDING_COLUMNS = (
    JobModel.id,
    JobModel.tenant,
    JobModel.user,
    JobModel.pool,
    JobModel.priority,
    JobModel.version,
    JobModel.submit_time,
    JobModel.eligible_time,
    JobModel.start_time,
    JobModel.end_time,
    JobModel.last_checkpoint_time,
    JobModel.restart_count,
    JobModel.held,
    JobModel.exit_code,
    JobModel.signal,
    JobModel.reason,
    JobModel.isolation,
    JobModel.pending_reason,
    JobModel.estimated_start,
    cast(JobModel.spec, Text).label("spec_text"),
)


_RUNNING_COLUMNS = (
    JobModel.id,
    JobModel.tenant,
    JobModel.pool,
    JobModel.priority,
    JobModel.last_checkpoint_time,
    JobModel.isolation,
    cast(JobModel.spec, Text).label("spec_text"),
)


def _pending(
    s: Session, cpu_per_gpu: dict[str, int], cache: SpecCache
) -> tuple[list[Job], dict[str, PendingRead]]:
    jobs: list[Job] = []
    reads: dict[str, PendingRead] = {}
    rows = s.execute(select(*_PENDING_COLUMNS).where(JobModel.state == JobState.PENDING.value))
    for r in rows:
        spec, array = cache.get(str(r.spec_text), cpu_per_gpu.get(r.pool))
        jobs.append(
            Job(
                id=r.id,
                spec=spec,
                tenant=r.tenant,
                user=r.user,
                priority=r.priority,
                state=JobState.PENDING,
                version=r.version,
                submit_time=r.submit_time,
                eligible_time=r.eligible_time,
                start_time=r.start_time,
                end_time=r.end_time,
                last_checkpoint_time=r.last_checkpoint_time,
                restart_count=r.restart_count,
                held=r.held,
                exit_code=r.exit_code,
                signal=r.signal,
                reason=r.reason,
                isolation=IsolationMode(r.isolation) if r.isolation else None,
                array=array,
            )
        )
        reads[r.id] = PendingRead(r.version, r.pending_reason, r.estimated_start)
    return jobs, reads


def _running(
    s: Session,
    live: list[AssignmentModel],
    slices: dict[str, list[SliceModel]],
    cpu_per_gpu: dict[str, int],
    cache: SpecCache,
) -> list[RunningReplica]:
    """The live assignments that hold slices, as the scheduler sees them. Their jobs' specs are
    read through ``cache`` as the pending ones are (typed, with the default CPU rule)."""
    job_ids = {a.job_id for a in live}
    jobs = (
        {r.id: r for r in s.execute(select(*_RUNNING_COLUMNS).where(JobModel.id.in_(job_ids)))}
        if job_ids
        else {}
    )
    running: list[RunningReplica] = []
    for a in live:
        held = slices.get(a.id)
        job = jobs.get(a.job_id)
        if not held or job is None:
            continue
        spec, _ = cache.get(str(job.spec_text), cpu_per_gpu.get(job.pool))
        start = a.started_at or a.created_at
        expected = spec.expected_duration_s or spec.time_limit_s
        running.append(
            RunningReplica(
                job_id=a.job_id,
                replica=a.rank,
                node=a.node,
                devices=tuple(sl.device_uuid for sl in held),
                milli_per_device=held[0].milli,
                memory_per_device_mib=held[0].memory_mib,
                tenant=job.tenant,
                pool=job.pool,
                priority=job.priority,
                preemptible=spec.preemptible,
                start_time=start,
                expected_end=start + float(expected) if expected else None,
                last_checkpoint_time=job.last_checkpoint_time,
                cpu_milli=spec.resources.cpu_milli,
                host_memory_mib=spec.resources.host_memory_mib,
                grace_period_s=StopPolicy.of(spec).grace_s,
                preempted_for=a.stop_for,
                stop_ordered=a.stop_reason is not None,
                isolation=job.isolation or spec.isolation.value,  # enforced, else asked for
            )
        )
    return running


def build_snapshot(
    s: Session, now: float, cache: SpecCache | None = None, cluster: ClusterCache | None = None
) -> tuple[ClusterSnapshot, dict[str, PendingRead]]:
    """The snapshot, and what it read of every pending job (for the commit's checks).

    ``cache``: the loop's :class:`SpecCache` (a fresh one parses every spec); ``cluster``: its
    :class:`ClusterCache` (a fresh one makes every node and device)."""
    cache = cache if cache is not None else SpecCache()
    cluster = cluster if cluster is not None else ClusterCache()
    core = s.connection()  # plain rows: the ORM's per-row work is not needed for columns
    nodes = [
        cluster.nodes.get(tuple(r))
        for r in core.execute(select(*_NODE_COLUMNS).order_by(NodeModel.name)).all()
    ]
    down = {n.name for n in nodes if n.state is NodeState.DOWN}
    devices = []
    order = (DeviceModel.node, DeviceModel.index)
    for r in core.execute(select(*DEVICE_COLUMNS).order_by(*order)).all():
        dev = cluster.devices.get(tuple(r))
        if dev.node in down and dev.health is DeviceHealth.HEALTHY:
            dev = replace(dev, health=DeviceHealth.UNKNOWN)
        devices.append(dev)
    cpu_per_gpu = cpu_per_gpu_by_pool(
        {n.name: n.cpu_milli for n in nodes}, ((d.node, d.pool) for d in devices)
    )
    live = list(
        s.scalars(
            select(AssignmentModel).where(AssignmentModel.state != AssignmentState.FINISHED.value)
        )
    )
    slices: dict[str, list[SliceModel]] = defaultdict(list)
    for sl in s.scalars(
        select(SliceModel).where(SliceModel.active.is_(True)).order_by(SliceModel.id)
    ):
        slices[sl.assignment_id].append(sl)
    pending, reads = _pending(s, cpu_per_gpu, cache)
    running = _running(s, live, slices, cpu_per_gpu, cache)
    quotas = list(s.scalars(select(QuotaModel)))
    usage, budget = _usage(s, now, quotas)
    snapshot = ClusterSnapshot(
        now=now,
        nodes=tuple(nodes),
        devices=tuple(devices),
        running=tuple(running),
        pending=tuple(pending),
        pools=tuple(
            pool_from_row(p) for p in s.scalars(select(PoolModel).order_by(PoolModel.name))
        ),
        tenants=tuple(tenant_from_row(t) for t in s.scalars(select(TenantModel))),
        quotas=tuple(quota_from_row(q) for q in quotas),
        priority_classes=tuple(
            priority_class_from_row(p) for p in s.scalars(select(PriorityClassModel))
        ),
        usage=usage,
        budget_used=budget,
    )
    cache.end_snapshot()
    cluster.end_snapshot()
    return snapshot, reads
