"""Named conversions from domain values to wire models (the API's only output shapes)."""

from __future__ import annotations

from gpupool.control.services.accounting import UsageLine
from gpupool.control.services.jobviews import JobDetail
from gpupool.control.services.nodes import DeviceSample, DeviceSlice
from gpupool.control.services.nodes import NodeView as NodeInfo
from gpupool.control.services.tenants import Standing
from gpupool.control.services.users import IssuedToken, TokenInfo
from gpupool.domain.jobs import Job
from gpupool.domain.mail import shown_mail_user
from gpupool.domain.nodes import Device
from gpupool.domain.pools import Pool
from gpupool.domain.tenants import PriorityClass, Quota, Tenant
from gpupool.domain.transitions import JobEvent
from gpupool.domain.users import User
from gpupool.scheduling.decision import PriorityFactors
from gpupool.schemas.admin import (
    IssuedTokenView,
    PoolView,
    PriorityClassView,
    QuotaView,
    TenantView,
    TokenView,
    UserView,
)
from gpupool.schemas.containers import container_wire
from gpupool.schemas.jobs import FactorView, JobEventView, JobSliceView, JobView
from gpupool.schemas.nodes import DeviceSliceView, DeviceView, NodeView, UsageLineView


def job_view(
    job: Job, detail: JobDetail | None = None, factors: PriorityFactors | None = None
) -> JobView:
    spec = job.spec
    res = spec.resources
    return JobView(
        id=job.id,
        name=spec.name,
        tenant=job.tenant,
        user=job.user,
        pool=spec.pool,
        state=job.state.value,
        state_code=job.state.code,
        priority_class=spec.priority_class,
        priority=job.priority,
        version=job.version,
        replicas=spec.replicas,
        gpu_milli=res.gpu_milli,
        gpu_memory_mib=res.gpu_memory_mib,
        gpu_types=list(res.gpu_types),
        command=list(spec.command),
        script=spec.script,
        preemptible=spec.preemptible,
        held=job.held,
        submit_time=job.submit_time,
        eligible_time=job.eligible_time,
        start_time=job.start_time,
        end_time=job.end_time,
        restart_count=job.restart_count,
        exit_code=job.exit_code,
        signal=job.signal,
        reason=job.reason,
        isolation=job.isolation.value if job.isolation else None,
        time_limit_s=spec.time_limit_s,
        container=container_wire(spec.container),
        array_id=job.array.array_id if job.array else None,
        array_index=job.array.index if job.array else None,
        dependency=spec.dependency.text() if spec.dependency is not None else None,
        nodelist=list(spec.nodelist),
        exclude=list(spec.exclude),
        output=spec.stdout_path,
        error=spec.stderr_path,
        time_min_s=spec.time_min_s,
        constraint=spec.constraint.text if spec.constraint is not None else None,
        pty=spec.pty is not None,
        requeue=spec.requeue.value,
        max_restarts=spec.max_restarts,
        mail_type=list(spec.mail_type),
        mail_user=shown_mail_user(spec.mail_user) if spec.mail_user is not None else None,
        pending_reason=detail.pending_reason if detail else None,
        estimated_start=detail.estimated_start if detail else None,
        nodes=list(detail.nodes) if detail else [],
        slices=[
            JobSliceView(
                replica=x.replica,
                node=x.node,
                device_uuid=x.device_uuid,
                milli=x.milli,
                memory_mib=x.memory_mib,
                spilled_bytes=x.spilled_bytes,
            )
            for x in (detail.slices if detail else ())
        ],
        memory_oversubscription=detail.memory_oversubscription if detail else "fail",
        spilled_bytes=sum(x.spilled_bytes for x in detail.slices) if detail else 0,
        priority_factors=factor_views(factors),
    )


def factor_views(factors: PriorityFactors | None) -> list[FactorView] | None:
    """A job's factor table from the scheduler's last cycle; ``None`` when it has none."""
    if factors is None:
        return None
    return [
        FactorView(
            name=f.name,
            weight=f.weight,
            value=f.value,
            contribution=f.contribution,
            meaning=f.meaning,
        )
        for f in factors.factors
    ]


def event_view(e: JobEvent) -> JobEventView:
    return JobEventView(
        time=e.time,
        source=e.source.value,
        target=e.target.value,
        version=e.version,
        reason=e.reason,
    )


def device_view(
    d: Device, slices: tuple[DeviceSlice, ...] = (), sample: DeviceSample | None = None
) -> DeviceView:
    sample = sample or DeviceSample()
    return DeviceView(
        uuid=d.uuid,
        node=d.node,
        index=d.index,
        model=d.model,
        memory_mib=d.memory_mib,
        pool=d.pool,
        health=d.health.value,
        compute_capability=d.compute_capability,
        nvlink_group=d.nvlink_group,
        mig_parent=d.mig_parent,
        mig_profile=d.mig_profile,
        slices=[
            DeviceSliceView(
                job_id=x.job_id, tenant=x.tenant, milli=x.milli, memory_mib=x.memory_mib
            )
            for x in slices
        ],
        utilization_ratio=sample.utilization_ratio,
        memory_used_mib=sample.memory_used_mib,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
        sampled_at=sample.sampled_at,
    )


def node_view(n: NodeInfo) -> NodeView:
    return NodeView(
        name=n.node.name,
        state=n.node.state.value,
        address=n.address,
        cpu_milli=n.node.cpu_milli,
        memory_mib=n.node.memory_mib,
        agent_version=n.agent_version,
        isolation_modes=list(n.isolation_modes),
        container_engines=list(n.container_engines),
        last_heartbeat=n.last_heartbeat,
        labels=dict(n.node.labels),
        features=list(n.node.features),
        devices=[
            device_view(d, n.slices.get(d.uuid, ()), n.samples.get(d.uuid)) for d in n.devices
        ],
    )


def pool_view(p: Pool) -> PoolView:
    return PoolView(
        name=p.name,
        placement=p.placement,
        memory_overcommit=p.memory_overcommit,
        price_per_gpu_hour=dict(p.price_per_gpu_hour),
        default_price_per_gpu_hour=p.default_price_per_gpu_hour,
        memory_oversubscription=p.memory_oversubscription,
        container_engine=p.container_engine,
        image_registries=list(p.image_registries),
    )


def quota_view(q: Quota) -> QuotaView:
    return QuotaView(
        tenant=q.tenant,
        pool=q.pool,
        guaranteed_milli=q.guaranteed_milli,
        limit_milli=q.limit_milli,
        guaranteed_memory_mib=q.guaranteed_memory_mib,
        limit_memory_mib=q.limit_memory_mib,
        gpu_hour_budget=q.gpu_hour_budget,
        budget_window_s=q.budget_window_s,
    )


def tenant_view(
    t: Tenant, quotas: list[Quota] | None = None, standing: Standing | None = None
) -> TenantView:
    return TenantView(
        name=t.name,
        fair_share=t.fair_share,
        display_name=t.display_name,
        quotas=[quota_view(q) for q in quotas or []],
        decayed_usage_milli_s=standing.usage_milli_s if standing else None,
        fair_share_factor=standing.factor if standing else None,
    )


def priority_class_view(pc: PriorityClass) -> PriorityClassView:
    return PriorityClassView(name=pc.name, value=pc.value)


def user_view(u: User) -> UserView:
    return UserView(name=u.name, role=u.role.value, tenant=u.tenant)


def token_view(t: TokenInfo) -> TokenView:
    return TokenView(
        id=t.id,
        user=t.user,
        name=t.name,
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
    )


def issued_view(t: IssuedToken) -> IssuedTokenView:
    return IssuedTokenView(
        id=t.id, user=t.user, name=t.name, secret=t.secret, expires_at=t.expires_at
    )


def usage_view(line: UsageLine) -> UsageLineView:
    return UsageLineView(
        key=line.key,
        gpu_hours=line.gpu_hours,
        milli_seconds=line.milli_seconds,
        mib_seconds=line.mib_seconds,
        busy_milli_seconds=line.busy_milli_seconds,
        utilization_ratio=line.utilization_ratio,
        idle_ratio=line.idle_ratio,
        cost=line.cost,
        jobs=line.jobs,
    )
