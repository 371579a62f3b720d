"""Nodes and devices: registration, listing, draining, and failure detection.

A node registers with its devices; registering again (agent restart) updates the inventory
and keeps each known device's pool. A device the agent no longer reports leaves the node (its
usage history stays: it names the device, not the row); one that a live slice still holds is
marked unhealthy instead, so nothing new goes there, and leaves at a later registration. A node
silent for longer than ``node_timeout_s`` is marked ``down``: its live assignments end
(:func:`~gpupool.control.machinery.lifecycle.end_assignments`) with the stop reason ``node``,
unless a stop was already ordered (a cancelled job stays cancelled); their gang siblings on
other nodes are ordered to stop (and those nodes rung), and the job ends as ``NODE_FAIL``
(requeued where its policy allows). An operator may delete a node that is down and holds no
assignment (:meth:`NodeService.delete`); its agent, if it ever returns, registers it anew.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from gpupool import __version__
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.machinery.lifecycle import Ending, end_assignments
from gpupool.control.machinery.orders import mark
from gpupool.control.services import audit
from gpupool.control.services.auth import (
    Actor,
    Principal,
    agent_tokens,
    require,
    tenant_visible,
)
from gpupool.control.services.envelope import envelopes
from gpupool.domain.assignments import AssignmentState, StopReason
from gpupool.domain.errors import InvalidValue
from gpupool.domain.interactive import parse_features
from gpupool.domain.nodes import Device, DeviceHealth, Node, NodeState
from gpupool.domain.pools import DEFAULT_POOL, validate_name
from gpupool.domain.users import Permission
from gpupool.schemas.agent import RegisterRequest, RegisterResponse
from gpupool.store.mapping import device_from_row, node_from_row
from gpupool.store.models import (
    AssignmentModel,
    DeviceModel,
    EventModel,
    JobModel,
    LeaderModel,
    NodeModel,
    PoolModel,
    SliceModel,
)

log = logging.getLogger("gpupool.control.services.nodes")

#: The most a heard node's time in the store lags what this process heard (seconds; see
#: :meth:`NodeService.heard_every_s`).
HEARD_EVERY_S = 10.0


@dataclass(frozen=True)
class DeviceSlice:
    """A share of a device held by a job. ``job_id`` and ``tenant`` are ``None`` when the
    caller may not see the job (another tenant's): the slice is shown, its owner is not."""

    job_id: str | None
    tenant: str | None
    milli: int
    memory_mib: int


@dataclass(frozen=True)
class DeviceSample:
    """A device's latest telemetry as the agent reported it; ``None`` fields are unknown."""

    utilization_ratio: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sampled_at: float | None = None


@dataclass(frozen=True)
class NodeView:
    node: Node
    address: str | None
    agent_version: str
    isolation_modes: tuple[str, ...]
    last_heartbeat: float
    devices: tuple[Device, ...]
    slices: Mapping[str, tuple[DeviceSlice, ...]] = field(default_factory=dict)  # by uuid
    samples: Mapping[str, DeviceSample] = field(default_factory=dict)  # by device uuid
    container_engines: tuple[str, ...] = ()


def _device_slices(s: Session, principal: Principal) -> dict[str, tuple[DeviceSlice, ...]]:
    rows = s.execute(
        select(
            SliceModel.device_uuid,
            SliceModel.job_id,
            JobModel.tenant,
            SliceModel.milli,
            SliceModel.memory_mib,
        )
        .join(JobModel, JobModel.id == SliceModel.job_id)
        .where(SliceModel.active.is_(True))
        .order_by(SliceModel.id)
    )
    out: dict[str, list[DeviceSlice]] = {}
    for uuid, job_id, tenant, milli, mib in rows:
        seen = tenant_visible(principal, tenant)
        out.setdefault(uuid, []).append(
            DeviceSlice(job_id if seen else None, tenant if seen else None, milli, mib)
        )
    return {k: tuple(v) for k, v in out.items()}


def _devices_held(s: Session, uuids: list[str]) -> set[str]:
    """Which of ``uuids`` an active slice holds."""
    if not uuids:
        return set()
    return set(
        s.scalars(
            select(SliceModel.device_uuid).where(
                SliceModel.device_uuid.in_(uuids), SliceModel.active.is_(True)
            )
        )
    )


def current_epoch(session: Session) -> int:
    """The scheduling epoch now in force (0 before any leader took over)."""
    row = session.get(LeaderModel, 1)
    return row.epoch if row is not None else 0


class NodeService:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        #: Store time before which :meth:`mark_silent_nodes_down` can find no node to mark
        #: down (as of its last call; heartbeats only push it later). ``inf``: no node is up.
        self.next_judgement = 0.0
        #: Store time before which no node can be found silent, whatever the lag: the oldest
        #: heartbeat of a node up at the last look (or the look itself when none was) plus the
        #: timeout without lag. Cycles before it do not look (a busy loop cycles many times a
        #: second). A node set up again by hand without a heartbeat is judged by then.
        self._silent_none_before = 0.0

    def register(self, actor: Actor, req: RegisterRequest) -> RegisterResponse:
        require(actor.principal, Permission.AGENT)
        try:
            validate_name("node", req.node)
            features = parse_features(req.features)  # before anything is written
        except InvalidValue as exc:
            raise Invalid(exc.message) from None
        now = self.cp.now()
        with self.cp.tx() as s:
            pool = req.pool or DEFAULT_POOL
            if s.get(PoolModel, pool) is None:
                raise Invalid(f"pool {pool!r} does not exist: create it first or omit 'pool'")
            node = s.get(NodeModel, req.node)
            if node is None:
                node = NodeModel(name=req.node, registered_at=now)
                s.add(node)
            else:
                self._refuse_a_second_agent(node, req, now)
            if req.agent_id is not None:
                node.agent_id = req.agent_id
            node.address = req.address
            node.cpu_milli = req.cpu_milli
            node.memory_mib = req.memory_mib
            node.labels = dict(req.labels)
            node.agent_version = req.agent_version
            node.isolation_modes = list(req.isolation_modes)
            node.container_engines = list(req.container_engines)
            node.features = list(features)
            node.last_heartbeat = now
            if node.state == NodeState.DOWN.value or not node.state:
                node.state = NodeState.UP.value
            s.flush()
            known = {
                d.uuid: d
                for d in s.scalars(select(DeviceModel).where(DeviceModel.node == req.node))
            }
            # devices another node held before (moved here): one query, not one per device
            wanted = [info.uuid for info in req.devices if info.uuid not in known]
            moved = {
                d.uuid: d
                for d in (
                    s.scalars(select(DeviceModel).where(DeviceModel.uuid.in_(wanted)))
                    if wanted
                    else ()
                )
            }
            seen: set[str] = set()
            for info in req.devices:
                seen.add(info.uuid)
                dev = known.get(info.uuid) or moved.get(info.uuid)
                if dev is None:
                    dev = DeviceModel(uuid=info.uuid, pool=pool)
                    s.add(dev)
                dev.node = req.node
                dev.index = info.index
                dev.model = info.model
                dev.memory_mib = info.memory_mib
                cc = info.compute_capability
                dev.cc_major, dev.cc_minor = (cc[0], cc[1]) if cc else (None, None)
                dev.nvlink_group = info.nvlink_group
                dev.mig_parent = info.mig_parent
                dev.mig_profile = info.mig_profile
                dev.context_reserve_mib = info.context_reserve_mib
                dev.health = DeviceHealth.HEALTHY.value
            gone = [dev for uuid, dev in known.items() if uuid not in seen]
            held = _devices_held(s, [d.uuid for d in gone])
            for dev in gone:
                if dev.uuid in held:
                    dev.health = DeviceHealth.UNHEALTHY.value
                else:
                    s.delete(dev)
            audit.record(s, actor, "node.register", now, target=req.node)
            epoch = current_epoch(s)
        self.cp.settled.forget(req.node)  # its next heartbeat is applied in full
        self.cp.reports.forget(req.node)
        envelopes(self.cp).invalidate()  # submits judge by the new inventory at once
        self.cp.poke()
        return RegisterResponse(
            node_id=req.node,
            epoch=epoch,
            heartbeat_interval_s=self.cp.settings.heartbeat_interval_s,
            node_timeout_s=self.cp.settings.node_timeout_s,
            server_version=__version__,
        )

    def _refuse_a_second_agent(self, node: NodeModel, req: RegisterRequest, now: float) -> None:
        """A node is spoken for by one agent: while it is alive (not down, heard within the node
        timeout), a registration from an agent with another id is refused, so two agents never
        merge their devices into one node. Agents that send no id are not checked."""
        timeout = self.cp.settings.node_timeout_s
        if (
            req.agent_id is None
            or node.agent_id is None
            or node.agent_id == req.agent_id
            or node.state == NodeState.DOWN.value
            or now - node.last_heartbeat > timeout
        ):
            return
        raise Conflict(
            f"node {node.name} is already served by a live agent (at {node.address or '?'}, "
            f"last heartbeat {max(0.0, now - node.last_heartbeat):.0f}s ago): give this agent "
            f"its own name with --node NAME (the default is the host name), or stop the other "
            f"agent; the name is free again once the node is marked down ({timeout:.0f}s "
            "without heartbeats)"
        )

    def list_nodes(self, principal: Principal) -> list[NodeView]:
        require(principal, Permission.NODE_READ)
        with self.cp.read() as s:
            devices: dict[str, list[Device]] = {}
            samples: dict[str, DeviceSample] = {}
            for d in s.scalars(select(DeviceModel).order_by(DeviceModel.node, DeviceModel.index)):
                devices.setdefault(d.node, []).append(device_from_row(d))
                samples[d.uuid] = DeviceSample(
                    d.utilization_ratio, d.memory_used_mib, d.temperature_c, d.power_w, d.sampled_at
                )
            slices = _device_slices(s, principal)
            return [
                NodeView(
                    node=node_from_row(n),
                    address=n.address,
                    agent_version=n.agent_version,
                    isolation_modes=tuple(n.isolation_modes),
                    last_heartbeat=n.last_heartbeat,
                    devices=tuple(devices.get(n.name, ())),
                    slices={d.uuid: slices.get(d.uuid, ()) for d in devices.get(n.name, ())},
                    samples={d.uuid: samples[d.uuid] for d in devices.get(n.name, ())},
                    container_engines=tuple(n.container_engines or ()),
                )
                for n in s.scalars(select(NodeModel).order_by(NodeModel.name))
            ]

    def delete(self, actor: Actor, name: str) -> None:
        """Remove a node that is down and holds no assignment, with its devices (audited)."""
        require(actor.principal, Permission.NODE_MANAGE)
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(NodeModel, name)
            if row is None:
                raise NotFound(f"node {name!r} not found: list nodes with `gpupool nodes`")
            if row.state != NodeState.DOWN.value:
                raise Conflict(
                    f"node {name} is {row.state}: only a down node can be deleted. Drain it "
                    f"(gpupool drain {name}), stop its agent and wait until it is marked down "
                    f"({self.cp.settings.node_timeout_s:.0f}s without heartbeats), then delete it"
                )
            live = s.scalars(
                select(AssignmentModel.job_id).where(
                    AssignmentModel.node == name,
                    AssignmentModel.state != AssignmentState.FINISHED.value,
                )
            ).all()
            if live:
                raise Conflict(
                    f"node {name} still holds {len(live)} assignment(s) (jobs "
                    f"{', '.join(sorted(set(live))[:5])}): wait for them to end, or cancel them "
                    "with gpupool cancel, then delete it"
                )
            for dev in s.scalars(select(DeviceModel).where(DeviceModel.node == name)):
                s.delete(dev)
            s.delete(row)
            message = f"node {name} deleted by {actor.principal.user}"
            s.add(EventModel(time=now, kind="node.deleted", subject=name, message=message))
            audit.record(s, actor, "node.delete", now, target=name)
        self.cp.settled.forget(name)
        envelopes(self.cp).invalidate()
        self.cp.poke()

    def get(self, principal: Principal, name: str) -> NodeView:
        for view in self.list_nodes(principal):
            if view.node.name == name:
                return view
        raise NotFound(f"node {name!r} not found: list nodes with `gpupool nodes`")

    def set_state(self, actor: Actor, name: str, state: NodeState) -> Node:
        """Drain a node (nothing new placed, running jobs finish) or bring it back up."""
        require(actor.principal, Permission.NODE_MANAGE)
        if state not in (NodeState.UP, NodeState.DRAINING):
            raise Invalid("a node can be set to 'up' or 'draining'; 'down' is detected")
        now = self.cp.now()
        with self.cp.tx() as s:
            row = s.get(NodeModel, name)
            if row is None:
                raise NotFound(f"node {name!r} not found: list nodes with `gpupool nodes`")
            row.state = state.value
            audit.record(s, actor, f"node.{state.value}", now, target=name)
            node = node_from_row(row)
        self.cp.poke()
        return node

    def mark_silent_nodes_down(self, watching_since: float) -> list[str]:
        """Mark nodes past their heartbeat timeout down and fail their live assignments.

        ``watching_since`` is when the caller began to watch heartbeats without a break
        (its start, its take-over as leader, or the store coming back after an outage).
        Silence before that moment proves nothing: the agents may have been knocking on a
        stopped server or a server without its store. So a node is judged only on
        ``node_timeout_s`` of silence after it, and nobody is judged while that grace runs.

        Nor is a node judged for the server's own slowness: heartbeats this server shed are
        written first (:meth:`record_heard`), and the timeout is extended by the server's lag
        (how late it has been recording heartbeats, :mod:`~.machinery.admission`).
        """
        now = self.cp.now()
        if now < self._silent_none_before:
            return []  # nobody to judge: the heard nodes are written by the liveness batch
        self.record_heard()  # shed heartbeats count: written before anyone is judged
        now = self.cp.now()
        lag = self.cp.admission.lag()
        timeout = self.cp.settings.node_timeout_s + lag
        deadline = now - timeout
        downed: list[str] = []
        if watching_since > deadline:
            self.next_judgement = watching_since + timeout
            return downed
        with self.cp.tx() as s:
            silent = list(
                s.scalars(
                    select(NodeModel).where(
                        NodeModel.last_heartbeat < deadline,
                        NodeModel.state != NodeState.DOWN.value,
                    )
                )
            )
            for node in silent:
                node.state = NodeState.DOWN.value
                downed.append(node.name)
                message = (
                    f"node {node.name} missed heartbeats for {now - node.last_heartbeat:.0f}s: "
                    "marked down, its jobs are failed over"
                )
                if lag >= 1.0:
                    message += f" (the timeout was extended by the server's own lag, {lag:.0f}s)"
                log.warning(message)
                s.add(EventModel(time=now, kind="node.down", subject=node.name, message=message))
                mark(s, [node.name])  # no server answers its heartbeats from memory now
                self.cp.settled.forget(node.name)
                live = s.scalars(
                    select(AssignmentModel)
                    .where(
                        AssignmentModel.node == node.name,
                        AssignmentModel.state != AssignmentState.FINISHED.value,
                    )
                    .order_by(AssignmentModel.job_id, AssignmentModel.rank)
                )
                lost = Ending(reason=StopReason.NODE, message=f"node {node.name} went down")
                end_assignments(s, [(a, lost) for a in live], now)
            oldest = s.scalar(
                select(func.min(NodeModel.last_heartbeat)).where(
                    NodeModel.state != NodeState.DOWN.value
                )
            )
        # No node can be judged before its last heartbeat plus the timeout: the scheduling loop
        # sleeps until then when it has nothing else to do (an idle pool does not poll).
        self.next_judgement = math.inf if oldest is None else float(oldest) + timeout
        seen = now if oldest is None else min(now, float(oldest))
        self._silent_none_before = seen + self.cp.settings.node_timeout_s
        if downed:
            self.cp.poke()
        return downed

    def heard_every_s(self) -> float:
        """How stale a heard node's time may be in the store (seconds): what another server
        process, leading, reads of it. This process writes everything before it judges."""
        return min(HEARD_EVERY_S, self.cp.settings.node_timeout_s / 4)

    def _check_unverified(self) -> None:
        """Nodes whose shed heartbeats came with a token not in memory: heard if the token
        is an agent's, valid now (one query for all; see ``Admission.heard_by_token``)."""
        unverified = self.cp.admission.take_unverified()
        if not unverified:
            return
        digests = sorted({digest for digest, _ in unverified.values()})
        try:
            with self.cp.read() as s:
                valid = agent_tokens(s, digests, self.cp.now())
        except Exception:
            for node, (digest, when) in unverified.items():  # checked at the next write
                self.cp.admission.heard_by_token(node, digest, when)
            raise
        for node, (digest, when) in unverified.items():
            if digest in valid:
                self.cp.admission.heard(node, when)

    def record_heard(self, *, due_only: bool = False) -> int:
        """Write when this server last heard each node whose heartbeat it did not apply (shed
        or quiet; one batched update; see :mod:`~gpupool.control.machinery.admission`);
        returns how many. ``due_only``: only those last written ``heard_every_s`` ago or more.
        A node marked down is not brought back by it: that takes a heartbeat applied."""
        self._check_unverified()
        every = self.heard_every_s() if due_only else 0.0
        heard = self.cp.admission.take_heard(every, self.cp.now())
        if not heard:
            return 0
        stamp = (
            update(NodeModel)
            .where(
                NodeModel.name == bindparam("n"),
                NodeModel.last_heartbeat < bindparam("t"),
                NodeModel.state != NodeState.DOWN.value,
            )
            .values(last_heartbeat=bindparam("t"))
            .execution_options(synchronize_session=False)
        )
        try:
            with self.cp.tx() as s:
                s.connection().execute(stamp, [{"n": n, "t": t} for n, t in heard.items()])
        except Exception:
            self.cp.admission.give_back_heard(heard)
            raise
        self.cp.admission.written(heard)
        return len(heard)
