"""Wire models for nodes, devices, usage reports and cluster events."""

from __future__ import annotations

from pydantic import Field

from gpupool.schemas.base import WireModel


class DeviceSliceView(WireModel):
    """A share of the device held by a job; ``job_id``/``tenant`` are null for a job of
    another tenant (drawn as an anonymous segment)."""

    job_id: str | None
    tenant: str | None
    milli: int
    memory_mib: int


class DeviceView(WireModel):
    uuid: str
    node: str
    index: int
    model: str
    memory_mib: int
    pool: str
    health: str
    compute_capability: tuple[int, int] | None = None
    nvlink_group: int | None = None
    mig_parent: str | None = None
    mig_profile: str | None = None
    slices: list[DeviceSliceView] = Field(default_factory=list)
    utilization_ratio: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sampled_at: float | None = None


class NodeView(WireModel):
    name: str
    state: str
    address: str | None
    cpu_milli: int
    memory_mib: int
    agent_version: str
    isolation_modes: list[str]
    last_heartbeat: float
    container_engines: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list)  # for --constraint
    devices: list[DeviceView] = Field(default_factory=list)


class SetNodeStateRequest(WireModel):
    state: str = Field(description="'up' or 'draining'")


class MoveDeviceRequest(WireModel):
    pool: str


class UsageLineView(WireModel):
    key: dict[str, str]
    gpu_hours: float
    milli_seconds: float
    mib_seconds: float
    busy_milli_seconds: float
    utilization_ratio: float
    idle_ratio: float
    cost: float
    jobs: int


class UsageReport(WireModel):
    start: float
    end: float
    group_by: list[str]
    lines: list[UsageLineView]


class ClusterEventView(WireModel):
    id: int
    time: float
    kind: str
    subject: str
    message: str
