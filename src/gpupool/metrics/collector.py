"""Scrape-time metrics: the store's view of devices, pools, queues and jobs.

:class:`ClusterCollector` turns a :class:`ClusterSample` (plain numbers read by the control
plane at scrape time) into Prometheus families, so every server replica reports the same
values. Units are base units: bytes, seconds, ratios, degrees Celsius, watts. Labels are
devices, nodes, pools, tenants and states, never job ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.domain.units import MILLI_PER_GPU, mib_to_bytes

DEVICE_LABELS = ["node", "device", "model", "pool"]


@dataclass(frozen=True)
class DeviceSample:
    node: str
    uuid: str
    model: str
    pool: str
    memory_mib: int
    healthy: bool
    allocated_milli: int
    allocated_memory_mib: int
    utilization_ratio: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    hot: bool = False
    spilled_bytes: int = 0  # over its slices: host memory serving them (isolation shim spill)


@dataclass(frozen=True)
class ClusterSample:
    devices: list[DeviceSample] = field(default_factory=list)
    queue: dict[tuple[str, str], int] = field(default_factory=dict)  # (pool, tenant) -> jobs
    jobs_by_state: dict[str, int] = field(default_factory=dict)
    nodes_by_state: dict[str, int] = field(default_factory=dict)
    pool_physical_mib: dict[str, int] = field(default_factory=dict)
    pool_allocated_mib: dict[str, int] = field(default_factory=dict)


class ClusterCollector(Collector):
    def __init__(self, read: Callable[[], ClusterSample]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        sample = self._read()
        util = GaugeMetricFamily(
            "gpupool_gpu_utilization_ratio", "GPU utilisation from telemetry", labels=DEVICE_LABELS
        )
        used = GaugeMetricFamily(
            "gpupool_gpu_memory_used_bytes", "GPU memory in use (telemetry)", labels=DEVICE_LABELS
        )
        alloc = GaugeMetricFamily(
            "gpupool_gpu_memory_allocated_bytes",
            "GPU memory promised to slices",
            labels=DEVICE_LABELS,
        )
        total = GaugeMetricFamily(
            "gpupool_gpu_memory_total_bytes", "Physical GPU memory", labels=DEVICE_LABELS
        )
        compute = GaugeMetricFamily(
            "gpupool_gpu_compute_allocated_ratio",
            "Share of the device's compute given to slices (1 = whole device)",
            labels=DEVICE_LABELS,
        )
        temp = GaugeMetricFamily(
            "gpupool_gpu_temperature_celsius", "GPU temperature", labels=DEVICE_LABELS
        )
        power = GaugeMetricFamily("gpupool_gpu_power_watts", "GPU power draw", labels=DEVICE_LABELS)
        healthy = GaugeMetricFamily(
            "gpupool_gpu_healthy", "1 when the device may take work", labels=DEVICE_LABELS
        )
        spilled = GaugeMetricFamily(
            "gpupool_slice_spilled_bytes",
            "Bytes of the device's slices served from host memory because the GPU was full "
            "(isolation shim, pools with memory_oversubscription spill)",
            labels=DEVICE_LABELS,
        )
        mem_share = GaugeMetricFamily(
            "gpupool_gpu_mem_share_ratio",
            "GPU memory promised to the device's slices over its physical memory (above 1: "
            "oversubscribed under the pool's memory_overcommit)",
            labels=DEVICE_LABELS,
        )
        alerts = GaugeMetricFamily(
            "gpupool_alerts", "Devices with an alert in force, by kind", labels=["kind"]
        )
        hot = unhealthy = 0
        for d in sample.devices:
            lv = [d.node, d.uuid, d.model, d.pool]
            if d.utilization_ratio is not None:
                util.add_metric(lv, d.utilization_ratio)
            if d.memory_used_mib is not None:
                used.add_metric(lv, float(mib_to_bytes(d.memory_used_mib)))
            if d.temperature_c is not None:
                temp.add_metric(lv, d.temperature_c)
            if d.power_w is not None:
                power.add_metric(lv, d.power_w)
            alloc.add_metric(lv, float(mib_to_bytes(d.allocated_memory_mib)))
            total.add_metric(lv, float(mib_to_bytes(d.memory_mib)))
            compute.add_metric(lv, d.allocated_milli / MILLI_PER_GPU)
            if d.memory_mib:
                mem_share.add_metric(lv, d.allocated_memory_mib / d.memory_mib)
            healthy.add_metric(lv, 1.0 if d.healthy else 0.0)
            spilled.add_metric(lv, float(d.spilled_bytes))
            hot += d.hot
            unhealthy += not d.healthy
        alerts.add_metric(["temperature"], float(hot))
        alerts.add_metric(["health"], float(unhealthy))
        yield from (util, used, alloc, total, compute, mem_share, temp, power, healthy, spilled)
        yield alerts

        share = GaugeMetricFamily(
            "gpupool_mem_share_ratio",
            "GPU memory allocated or promised over physical GPU memory, per pool",
            labels=["pool"],
        )
        for pool, physical in sorted(sample.pool_physical_mib.items()):
            allocated = sample.pool_allocated_mib.get(pool, 0)
            share.add_metric([pool], allocated / physical if physical else 0.0)
        yield share
        queue = GaugeMetricFamily(
            "gpupool_scheduler_queue", "Pending jobs per pool and tenant", labels=["pool", "tenant"]
        )
        for (pool, tenant), n in sorted(sample.queue.items()):
            queue.add_metric([pool, tenant], float(n))
        yield queue
        jobs = GaugeMetricFamily("gpupool_jobs", "Jobs by state", labels=["state"])
        for state, n in sorted(sample.jobs_by_state.items()):
            jobs.add_metric([state], float(n))
        yield jobs
        nodes = GaugeMetricFamily("gpupool_nodes", "Nodes by state", labels=["state"])
        for state, n in sorted(sample.nodes_by_state.items()):
            nodes.add_metric([state], float(n))
        yield nodes
