"""The tables, as SQLAlchemy 2 declarative classes (names end in ``Model``).

Words and units follow the domain: milli-GPU and MiB as integers, times as float epoch seconds
from the injected clock (never the database's ``now()``), so the simulator and the tests control
time. Job specs are stored as JSON (the wire form of :class:`gpupool.domain.jobs.JobSpec`),
while the fields the scheduler filters on are columns.

- **slice**: a share of one device held by one assignment; ``active`` while the job holds it.
- **assignment**: one replica of one job on one node; its id is never reused.
- **usage**: accounting per job, device and hour bucket (``bucket_start`` epoch seconds).
- **leader**: one row, the scheduling epoch and who holds it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of every gpupool table."""


class PoolModel(Base):
    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    placement: Mapped[str] = mapped_column(String(64), default="default")
    memory_overcommit: Mapped[float] = mapped_column(Float, default=1.0)
    prices: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    default_price: Mapped[float] = mapped_column(Float, default=0.0)
    memory_oversubscription: Mapped[str] = mapped_column(String(8), default="fail")
    container_engine: Mapped[str | None] = mapped_column(String(16), nullable=True)
    image_registries: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float)


class TenantModel(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    fair_share: Mapped[float] = mapped_column(Float, default=1.0)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)


class QuotaModel(Base):
    __tablename__ = "quotas"

    tenant: Mapped[str] = mapped_column(
        String(64), ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True
    )
    pool: Mapped[str] = mapped_column(
        String(64), ForeignKey("pools.name", ondelete="CASCADE"), primary_key=True
    )
    guaranteed_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    limit_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    guaranteed_memory_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    limit_memory_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_hour_budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget_window_s: Mapped[float] = mapped_column(Float, default=30 * 86400.0)


class PriorityClassModel(Base):
    __tablename__ = "priority_classes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)


class UserModel(Base):
    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("tenants.name"), nullable=True, index=True
    )
    created_at: Mapped[float] = mapped_column(Float)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class TokenModel(Base):
    """An API token. Only the SHA-256 of the secret is stored; the secret is shown once."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.name", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200), default="")
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The token whose holder minted this one (None: made by the server itself, e.g. the first
    # admin token, or before revision 0008). Revoking a token revokes its descendants.
    parent_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)


class NodeModel(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str | None] = mapped_column(String(255), nullable=True)
    cpu_milli: Mapped[int] = mapped_column(BigInteger)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="up")
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    isolation_modes: Mapped[list[str]] = mapped_column(JSON, default=list)
    container_engines: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Node features for --constraint (gpupool agent --feature; domain/interactive.py).
    features: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    registered_at: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float] = mapped_column(Float)
    # The id of the agent that speaks for the node (None: an agent that sends none).
    agent_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Bumped by every transaction that gives the node new orders (a start, a stop, a resize)
    # or marks it down: servers that answer its quiet heartbeats from memory see that their
    # copy is stale (control/machinery/settled.py).
    orders_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class DeviceModel(Base):
    """A device and its latest telemetry (``None`` = never reported / not supported)."""

    __tablename__ = "devices"

    uuid: Mapped[str] = mapped_column(String(200), primary_key=True)
    node: Mapped[str] = mapped_column(
        String(64), ForeignKey("nodes.name", ondelete="CASCADE"), index=True
    )
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    pool: Mapped[str] = mapped_column(String(64), default="default", index=True)
    cc_major: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cc_minor: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nvlink_group: Mapped[int | None] = mapped_column(Integer, nullable=True)
    mig_parent: Mapped[str | None] = mapped_column(String(200), nullable=True)
    mig_profile: Mapped[str | None] = mapped_column(String(64), nullable=True)
    health: Mapped[str] = mapped_column(String(16), default="healthy")
    # What one process holds beyond its slice (MiB), as the agent measured it; NULL: not said.
    context_reserve_mib: Mapped[int | None] = mapped_column(Integer, nullable=True)
    utilization_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    xid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sampled_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobModel(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("user", "idempotency_key", name="uq_jobs_user_idempotency"),
        Index("ix_jobs_state_pool", "state", "pool"),
        Index("ix_jobs_tenant_submit", "tenant", "submit_time"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    tenant: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer)
    submit_time: Mapped[float] = mapped_column(Float)
    eligible_time: Mapped[float] = mapped_column(Float)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_checkpoint_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    isolation: Mapped[str | None] = mapped_column(String(16), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    pending_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    estimated_start: Mapped[float | None] = mapped_column(Float, nullable=True)

    # Optimistic concurrency: every UPDATE says "WHERE version = <the version I read>"; the
    # domain's transition() sets the new version, so SQLAlchemy must not generate one.
    __mapper_args__ = {"version_id_col": version, "version_id_generator": False}  # noqa: RUF012


class JobEventModel(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    time: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class AssignmentModel(Base):
    """One replica on one node. ``state``: dispatched, running, stopping, finished."""

    __tablename__ = "assignments"
    __table_args__ = (Index("ix_assignments_node_state", "node", "state"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    rank: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # the job's restart count then
    node: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="dispatched")
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stop_grace_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The job a preemption stop makes room for (``None`` for every other stop): the snapshot
    # gives it to the scheduler, so that job waits for this replica instead of preempting more.
    stop_for: Mapped[str | None] = mapped_column(String(32), nullable=True)
    isolation: Mapped[str | None] = mapped_column(String(16), nullable=True)
    master_port: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SliceModel(Base):
    """A share of one device held by one assignment."""

    __tablename__ = "slices"
    __table_args__ = (Index("ix_slices_device_active", "device_uuid", "active"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    assignment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("assignments.id", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    device_uuid: Mapped[str] = mapped_column(String(200))
    milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    accounted_until: Mapped[float] = mapped_column(Float)
    #: Bytes the replica holds in host memory on this device (shim spill), as last reported.
    spilled_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageModel(Base):
    """Usage of one job on one device within one hour (``bucket_start``, epoch seconds).

    ``milli_seconds`` / ``mib_seconds``: allocation integrated over time. ``busy_milli_seconds``:
    the allocation weighted by the device's reported utilisation (``None`` samples count as
    idle). ``cost``: milli-seconds priced by the pool's price for the device's model.
    """

    __tablename__ = "usage"
    __table_args__ = (
        UniqueConstraint("job_id", "device_uuid", "bucket_start", name="uq_usage_bucket"),
        Index("ix_usage_bucket", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32))
    device_uuid: Mapped[str] = mapped_column(String(200))
    bucket_start: Mapped[float] = mapped_column(Float)
    tenant: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(200))
    milli_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    mib_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    busy_milli_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)


class AuditModel(Base):
    """One mutating call: who, what, when, from where, and how it ended."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_time", "time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(500))
    status: Mapped[int] = mapped_column(Integer)
    remote: Mapped[str | None] = mapped_column(String(100), nullable=True)
    target: Mapped[str | None] = mapped_column(String(200), nullable=True)


class EventModel(Base):
    """Cluster events (alerts, node changes) for the live feed; job state changes live in
    ``job_events``. ``kind`` e.g. ``alert.temperature``, ``node.down``."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)


class LeaderModel(Base):
    """One row (id 1): the scheduling epoch, the server that holds it, and until when its lease
    runs (``expires``: wall-clock seconds; 0 = free; see control/machinery/leader.py)."""

    __tablename__ = "leader"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    holder: Mapped[str] = mapped_column(String(200), default="")
    since: Mapped[float] = mapped_column(Float, default=0.0)
    expires: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class UploadModel(Base):
    """A working-directory archive (gzip'd tar) a client uploaded for its jobs. The bytes live in
    the store so that every server replica can hand them to any node's agent; ``data`` is only
    loaded when an agent fetches it."""

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, index=True)
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class NoticeModel(Base):
    """One ``--mail-type`` notice waiting to be sent: the outbox (see control/notify.py).

    Written in the transaction that moved the job, deleted once sent or finally failed.
    ``due``: wall-clock epoch seconds of the next attempt (0 = at once). ``claimed_by``: the
    server process sending it now (``None``: nobody), until ``claimed_until`` (epoch seconds;
    past it, any process may claim it again). ``attempts``: sends tried so far."""

    __tablename__ = "notices"
    __table_args__ = (Index("ix_notices_due", "due"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32))
    recipient: Mapped[str] = mapped_column(Text)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    due: Mapped[float] = mapped_column(Float, default=0.0)
    claimed_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    claimed_until: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float)
