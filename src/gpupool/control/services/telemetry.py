"""Reading the store for ``/metrics``: one short transaction per scrape.

Terminal jobs are counted too (``gpupool_jobs{state="COMPLETED"}``), from an aggregate query,
so the cost of a scrape grows with devices, pools and tenants, not with job history rows read.

Tenant names are private to the pool's users: ``/metrics`` may be open to anyone who can
reach the port, so unless the server is started with ``--metrics-tenants``
(``ServerSettings.metrics_tenants``) or the scrape carries an admin's or operator's token, the
queue is counted per pool only, under the tenant label ``""`` (the label stays, so queries by
``(pool, tenant)`` keep working).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.domain.nodes import DeviceHealth
from gpupool.domain.states import JobState
from gpupool.metrics.collector import ClusterSample, DeviceSample
from gpupool.store.models import DeviceModel, JobModel, NodeModel, SliceModel


def read_sample(cp: ControlPlane, *, tenant_names: bool | None = None) -> ClusterSample:
    """One scrape's sample; ``tenant_names`` (default: ``metrics_tenants``) labels the queue
    with tenant names, else it is counted per pool under tenant ``""``."""
    hot_c = cp.settings.temperature_alert_c
    with cp.read() as s:
        held = {
            uuid: (int(m or 0), int(mem or 0), int(spilled or 0))
            for uuid, m, mem, spilled in s.execute(
                select(
                    SliceModel.device_uuid,
                    func.sum(SliceModel.milli),
                    func.sum(SliceModel.memory_mib),
                    func.sum(SliceModel.spilled_bytes),
                )
                .where(SliceModel.active.is_(True))
                .group_by(SliceModel.device_uuid)
            )
        }
        devices: list[DeviceSample] = []
        physical: dict[str, int] = defaultdict(int)
        allocated: dict[str, int] = defaultdict(int)
        for d in s.scalars(select(DeviceModel).order_by(DeviceModel.node, DeviceModel.index)):
            milli, mem, spilled = held.get(d.uuid, (0, 0, 0))
            physical[d.pool] += d.memory_mib
            allocated[d.pool] += mem
            devices.append(
                DeviceSample(
                    node=d.node,
                    uuid=d.uuid,
                    model=d.model,
                    pool=d.pool,
                    memory_mib=d.memory_mib,
                    healthy=d.health == DeviceHealth.HEALTHY.value,
                    allocated_milli=milli,
                    allocated_memory_mib=mem,
                    utilization_ratio=d.utilization_ratio,
                    memory_used_mib=d.memory_used_mib,
                    temperature_c=d.temperature_c,
                    power_w=d.power_w,
                    hot=d.temperature_c is not None and d.temperature_c >= hot_c,
                    spilled_bytes=spilled,
                )
            )
        named = cp.settings.metrics_tenants if tenant_names is None else tenant_names
        queue: dict[tuple[str, str], int] = {}
        for pool, tenant, n in s.execute(
            select(JobModel.pool, JobModel.tenant, func.count())
            .where(JobModel.state == JobState.PENDING.value)
            .group_by(JobModel.pool, JobModel.tenant)
        ):
            key = (pool, tenant if named else "")
            queue[key] = queue.get(key, 0) + int(n)
        by_state = {
            state: int(n)
            for state, n in s.execute(select(JobModel.state, func.count()).group_by(JobModel.state))
        }
        nodes = {
            state: int(n)
            for state, n in s.execute(
                select(NodeModel.state, func.count()).group_by(NodeModel.state)
            )
        }
    return ClusterSample(
        devices=devices,
        queue=queue,
        jobs_by_state={st.value: by_state.get(st.value, 0) for st in JobState},
        nodes_by_state=nodes,
        pool_physical_mib=dict(physical),
        pool_allocated_mib=dict(allocated),
    )
