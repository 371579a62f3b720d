"""Live device telemetry, read from the server's Prometheus ``/metrics`` page.

The API's device views carry inventory only (model, memory, pool, health); the latest sample of
each device (utilisation, memory used, temperature, power) and what is allocated on it are
exported as ``gpupool_gpu_*`` gauges. :func:`parse_metrics` turns that page into one
:class:`DeviceSample` per device and one :class:`PoolSample` per pool. Units follow the rest of
gpupool: milli-GPU and MiB integers, ratios in [0, 1]; ``None`` means "no sample".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceSample:
    uuid: str
    node: str
    model: str
    pool: str
    memory_mib: int
    allocated_milli: int
    allocated_memory_mib: int
    healthy: bool
    utilization_ratio: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class PoolSample:
    name: str
    mem_share_ratio: float | None
    queued: dict[str, int] = field(default_factory=dict)  # tenant -> pending jobs


@dataclass(frozen=True)
class ClusterTelemetry:
    devices: list[DeviceSample]
    pools: list[PoolSample]
    jobs_by_state: dict[str, int]


def parse_metrics(text: str) -> ClusterTelemetry:
    """Parse the ``/metrics`` page (Prometheus text format)."""
    per_device: dict[str, dict[str, float]] = defaultdict(dict)
    labels_of: dict[str, dict[str, str]] = {}
    share: dict[str, float] = {}
    queue: dict[str, dict[str, int]] = defaultdict(dict)
    jobs: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name.startswith("gpupool_gpu_") and "device" in labels:
                per_device[labels["device"]][name] = value
                labels_of[labels["device"]] = labels
            elif name == "gpupool_mem_share_ratio" and "pool" in labels:
                share[labels["pool"]] = value
            elif name == "gpupool_scheduler_queue" and "pool" in labels:
                queue[labels["pool"]][labels.get("tenant", "")] = int(value)
            elif name == "gpupool_jobs" and "state" in labels:
                jobs[labels["state"]] = int(value)
    devices = []
    for uuid, values in per_device.items():
        lab = labels_of[uuid]
        total = values.get("gpupool_gpu_memory_total_bytes", 0.0)
        used = values.get("gpupool_gpu_memory_used_bytes")
        devices.append(
            DeviceSample(
                uuid=uuid,
                node=lab.get("node", ""),
                model=lab.get("model", ""),
                pool=lab.get("pool", ""),
                memory_mib=int(total // _MIB),
                allocated_milli=round(
                    values.get("gpupool_gpu_compute_allocated_ratio", 0.0) * 1000
                ),
                allocated_memory_mib=int(
                    values.get("gpupool_gpu_memory_allocated_bytes", 0) // _MIB
                ),
                healthy=values.get("gpupool_gpu_healthy", 1.0) >= 0.5,
                utilization_ratio=values.get("gpupool_gpu_utilization_ratio"),
                memory_used_mib=int(used // _MIB) if used is not None else None,
                temperature_c=values.get("gpupool_gpu_temperature_celsius"),
                power_w=values.get("gpupool_gpu_power_watts"),
            )
        )
    devices.sort(key=lambda d: (d.node, d.uuid))
    names = sorted(set(share) | set(queue) | {d.pool for d in devices})
    pools = [PoolSample(n, share.get(n), dict(sorted(queue.get(n, {}).items()))) for n in names]
    return ClusterTelemetry(devices, pools, jobs)
