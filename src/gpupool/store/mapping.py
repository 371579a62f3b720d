"""Named conversions between table rows and domain objects.

A :class:`~gpupool.domain.jobs.JobSpec` is stored as a JSON object whose keys are the spec's
field names, with enums as their values and the resource request nested; ``spec_to_json`` and
``spec_from_json`` are exact inverses (a property test checks it).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpupool.domain.arrays import ArrayTask
from gpupool.domain.containers import ContainerSpec
from gpupool.domain.dependency import parse_dependency
from gpupool.domain.interactive import parse_constraint, parse_pty
from gpupool.domain.jobs import IsolationMode, Job, JobSpec, RequeuePolicy
from gpupool.domain.nodes import Device, DeviceHealth, Node, NodeState
from gpupool.domain.pools import Pool
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.states import JobState
from gpupool.domain.tenants import PriorityClass, Quota, Tenant, stored_fair_share
from gpupool.domain.transitions import JobEvent
from gpupool.domain.users import Role, User
from gpupool.store.models import (
    DeviceModel,
    JobEventModel,
    JobModel,
    NodeModel,
    PoolModel,
    PriorityClassModel,
    QuotaModel,
    TenantModel,
    UserModel,
)


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    res = spec.resources
    return {
        "name": spec.name,
        "command": list(spec.command),
        "script": spec.script,
        "env": dict(spec.env),
        "workdir": spec.workdir,
        "tenant": spec.tenant,
        "pool": spec.pool,
        "priority_class": spec.priority_class,
        "resources": {
            "gpu_milli": res.gpu_milli,
            "gpu_memory_mib": res.gpu_memory_mib,
            "gpu_types": list(res.gpu_types),
            "cpu_milli": res.cpu_milli,
            "host_memory_mib": res.host_memory_mib,
            "cpu_auto": res.cpu_auto,
        },
        "replicas": spec.replicas,
        "preemptible": spec.preemptible,
        "requeue": spec.requeue.value,
        "max_restarts": spec.max_restarts,
        "time_limit_s": spec.time_limit_s,
        "expected_duration_s": spec.expected_duration_s,
        "checkpoint_signal": spec.checkpoint_signal,
        "grace_period_s": spec.grace_period_s,
        "isolation": spec.isolation.value,
        **({"dependency": spec.dependency.text()} if spec.dependency is not None else {}),
        **({"nodelist": list(spec.nodelist)} if spec.nodelist else {}),
        **({"exclude": list(spec.exclude)} if spec.exclude else {}),
        **({"mail_type": list(spec.mail_type)} if spec.mail_type else {}),
        **({"mail_user": spec.mail_user} if spec.mail_user is not None else {}),
        "container": spec.container.to_json() if spec.container is not None else None,
        **_interactive_json(spec),
    }


def _interactive_json(spec: JobSpec) -> dict[str, Any]:
    """Issue 27's keys, each only when set (a job without them stores what it always did)."""
    out: dict[str, Any] = {}
    if spec.pty is not None:
        out["pty"] = spec.pty.to_json()
    if spec.stdout_path is not None:
        out["stdout_path"] = spec.stdout_path
    if spec.stderr_path is not None:
        out["stderr_path"] = spec.stderr_path
    if spec.time_min_s is not None:
        out["time_min_s"] = spec.time_min_s
    if spec.constraint is not None:
        out["constraint"] = spec.constraint.text
    return out


def spec_from_json(data: dict[str, Any]) -> JobSpec:
    res = data["resources"]
    return JobSpec(
        name=data["name"],
        command=tuple(data["command"]),
        script=data["script"],
        env=dict(data["env"]),
        workdir=data["workdir"],
        tenant=data["tenant"],
        pool=data["pool"],
        priority_class=data["priority_class"],
        resources=ResourceRequest(
            gpu_milli=res["gpu_milli"],
            gpu_memory_mib=res["gpu_memory_mib"],
            gpu_types=tuple(res["gpu_types"]),
            cpu_milli=res["cpu_milli"],
            host_memory_mib=res["host_memory_mib"],
            cpu_auto=bool(res.get("cpu_auto", False)),  # jobs stored before the rule: as asked
        ),
        replicas=data["replicas"],
        preemptible=data["preemptible"],
        requeue=RequeuePolicy(data["requeue"]),
        max_restarts=data["max_restarts"],
        time_limit_s=data["time_limit_s"],
        expected_duration_s=data["expected_duration_s"],
        checkpoint_signal=data["checkpoint_signal"],
        grace_period_s=data["grace_period_s"],
        isolation=IsolationMode(data["isolation"]),
        dependency=parse_dependency(data["dependency"]) if data.get("dependency") else None,
        nodelist=tuple(data.get("nodelist", ())),
        exclude=tuple(data.get("exclude", ())),
        mail_type=tuple(data.get("mail_type", ())),
        mail_user=data.get("mail_user"),
        container=ContainerSpec.from_json(data["container"]) if data.get("container") else None,
        pty=parse_pty(data["pty"]) if data.get("pty") else None,
        stdout_path=data.get("stdout_path"),
        stderr_path=data.get("stderr_path"),
        time_min_s=data.get("time_min_s"),
        constraint=parse_constraint(data["constraint"]) if data.get("constraint") else None,
    )


def _array_json(task: ArrayTask) -> dict[str, Any]:
    """A task as stored beside the spec; ``throttle`` only when the array has one (``%N``), so
    an array without stores what it always did."""
    out = asdict(task)
    if out.get("throttle") is None:
        out.pop("throttle", None)
    return out


def job_from_row(row: JobModel) -> Job:
    return Job(
        id=row.id,
        spec=spec_from_json(row.spec),
        tenant=row.tenant,
        user=row.user,
        priority=row.priority,
        state=JobState(row.state),
        version=row.version,
        submit_time=row.submit_time,
        eligible_time=row.eligible_time,
        start_time=row.start_time,
        end_time=row.end_time,
        last_checkpoint_time=row.last_checkpoint_time,
        restart_count=row.restart_count,
        held=row.held,
        exit_code=row.exit_code,
        signal=row.signal,
        reason=row.reason,
        isolation=IsolationMode(row.isolation) if row.isolation else None,
        array=ArrayTask(**row.spec["array"]) if row.spec.get("array") else None,
    )


def job_to_row(job: Job, *, idempotency_key: str | None = None) -> JobModel:
    return JobModel(**job_values(job, idempotency_key=idempotency_key))


def job_values(job: Job, *, idempotency_key: str | None = None) -> dict[str, Any]:
    """Every column of a new job row, for a plain INSERT."""
    return {
        "id": job.id,
        "idempotency_key": idempotency_key,
        "name": job.spec.name,
        "spec": spec_to_json(job.spec) | ({"array": _array_json(job.array)} if job.array else {}),
        "tenant": job.tenant,
        "user": job.user,
        "pool": job.spec.pool,
        "priority": job.priority,
        "state": job.state.value,
        "version": job.version,
        "submit_time": job.submit_time,
        "eligible_time": job.eligible_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "last_checkpoint_time": job.last_checkpoint_time,
        "restart_count": job.restart_count,
        "held": job.held,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "reason": job.reason,
        "isolation": job.isolation.value if job.isolation else None,
        "pending_reason": None,
        "estimated_start": None,
    }


def apply_job(row: JobModel, job: Job) -> None:
    """Copy every mutable field of ``job`` onto ``row`` (the caller checked the version)."""
    row.name = job.spec.name
    # Keys kept beside the spec (``workdir_upload``, see gpupool.control.services.uploads) stay.
    row.spec = {**(row.spec or {}), **spec_to_json(job.spec)}
    row.tenant = job.tenant
    row.user = job.user
    row.pool = job.spec.pool
    row.priority = job.priority
    row.state = job.state.value
    row.version = job.version
    row.submit_time = job.submit_time
    row.eligible_time = job.eligible_time
    row.start_time = job.start_time
    row.end_time = job.end_time
    row.last_checkpoint_time = job.last_checkpoint_time
    row.restart_count = job.restart_count
    row.held = job.held
    row.exit_code = job.exit_code
    row.signal = job.signal
    row.reason = job.reason
    row.isolation = job.isolation.value if job.isolation else None


def event_to_row(event: JobEvent) -> JobEventModel:
    return JobEventModel(
        job_id=event.job_id,
        time=event.time,
        source=event.source.value,
        target=event.target.value,
        version=event.version,
        reason=event.reason,
    )


def event_from_row(row: JobEventModel) -> JobEvent:
    return JobEvent(
        job_id=row.job_id,
        time=row.time,
        source=JobState(row.source),
        target=JobState(row.target),
        version=row.version,
        reason=row.reason,
    )


def node_from_row(row: NodeModel) -> Node:
    return node_from_values(
        row.name,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        state=row.state,
        labels=row.labels,
        isolation_modes=row.isolation_modes,
        features=row.features,
    )


def node_from_values(
    name: str,
    *,
    cpu_milli: int,
    memory_mib: int,
    state: str,
    labels: dict[str, str] | None,
    isolation_modes: list[str] | None,
    features: list[str] | None,
) -> Node:
    """A node from its columns (the JSON ones parsed; ``None`` where the column is NULL)."""
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        state=NodeState(state),
        labels=tuple(sorted((labels or {}).items())),
        isolation_modes=tuple(isolation_modes or ()),
        features=tuple(features or ()),
    )


#: The columns of a device's row that make its :class:`Device`, in ``device_from_values``'s
#: order (not its telemetry, which the liveness batches rewrite every second).
DEVICE_COLUMNS = (
    DeviceModel.uuid,
    DeviceModel.node,
    DeviceModel.index,
    DeviceModel.model,
    DeviceModel.memory_mib,
    DeviceModel.pool,
    DeviceModel.cc_major,
    DeviceModel.cc_minor,
    DeviceModel.nvlink_group,
    DeviceModel.mig_parent,
    DeviceModel.mig_profile,
    DeviceModel.health,
    DeviceModel.context_reserve_mib,
)


def device_from_row(row: DeviceModel) -> Device:
    return device_from_values(tuple(getattr(row, c.key) for c in DEVICE_COLUMNS))


def device_from_values(v: tuple[Any, ...]) -> Device:
    """A device from the values of ``DEVICE_COLUMNS``, in that order."""
    uuid, node, index, model, memory_mib, pool, cc_major, cc_minor = v[:8]
    nvlink_group, mig_parent, mig_profile, health, context_reserve_mib = v[8:]
    cc = (cc_major, cc_minor) if cc_major is not None and cc_minor is not None else None
    return Device(
        uuid=uuid,
        node=node,
        index=index,
        model=model,
        memory_mib=memory_mib,
        pool=pool,
        compute_capability=cc,
        nvlink_group=nvlink_group,
        mig_parent=mig_parent,
        mig_profile=mig_profile,
        health=DeviceHealth(health),
        context_reserve_mib=context_reserve_mib,
    )


def pool_from_row(row: PoolModel) -> Pool:
    return Pool(
        name=row.name,
        placement=row.placement,
        memory_overcommit=row.memory_overcommit,
        price_per_gpu_hour=tuple(sorted(row.prices.items())),
        default_price_per_gpu_hour=row.default_price,
        memory_oversubscription=row.memory_oversubscription,
        container_engine=row.container_engine,
        image_registries=tuple(row.image_registries or ()),
    )


def tenant_from_row(row: TenantModel) -> Tenant:
    share = stored_fair_share(row.fair_share)  # rows from before the range was enforced
    return Tenant(name=row.name, fair_share=share, display_name=row.display_name)


def quota_from_row(row: QuotaModel) -> Quota:
    return Quota(
        tenant=row.tenant,
        pool=row.pool,
        guaranteed_milli=row.guaranteed_milli,
        limit_milli=row.limit_milli,
        guaranteed_memory_mib=row.guaranteed_memory_mib,
        limit_memory_mib=row.limit_memory_mib,
        gpu_hour_budget=row.gpu_hour_budget,
        budget_window_s=row.budget_window_s,
    )


def priority_class_from_row(row: PriorityClassModel) -> PriorityClass:
    return PriorityClass(name=row.name, value=row.value)


def user_from_row(row: UserModel) -> User:
    return User(name=row.name, role=Role(row.role), tenant=row.tenant)
