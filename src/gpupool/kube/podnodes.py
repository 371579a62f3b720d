"""Kubernetes nodes as gpupool nodes: the bridge plays their agent (register, heartbeat).

gpupool's scheduler places jobs on nodes it knows, with devices it knows. For pods, the nodes
are the Kubernetes Nodes whose GPUs gpupool's DRA driver published (:mod:`gpupool.kube.slices`):
:class:`PodNodes` registers each through the server's ordinary agent protocol
(``/v1/agent/register``, :mod:`gpupool.schemas.agent`), its devices read from its
ResourceSlice (UUID, index, product name, memory, NVLink group) and its CPU and memory from the
Node's allocatable, and heartbeats for it. The replicas it reports are the pods the bridge
bound there; the server's *start* orders become a claim allocation and a binding, its *stop*
orders an eviction (see :mod:`gpupool.kube.bridge`). Nothing in the server knows it is talking
to Kubernetes.

Words: the **agent id** of a node is derived from the node's name (stable across bridge
restarts, so a restarted bridge is the same agent); a node is registered again when its
slice's pool generation changes (a GPU lost or back). A tainted (unhealthy) device is reported
``healthy: false`` in each heartbeat's telemetry, so the scheduler keeps new work off it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpupool import __version__
from gpupool.domain.errors import GpupoolError
from gpupool.kube.claims import quantity
from gpupool.kube.client import KubeClient
from gpupool.kube.slices import DRIVER, RESOURCE_API
from gpupool.schemas.agent import (
    DeviceInfo,
    DeviceTelemetry,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    ReplicaStatus,
)
from gpupool.schemas.base import read_answer

log = logging.getLogger(__name__)


class AgentCallError(GpupoolError):
    """The server refused or did not answer an agent call for a Kubernetes node."""


@dataclass
class SliceNode:
    """A Kubernetes node as its ResourceSlice and Node show it."""

    name: str
    generation: int
    devices: tuple[DeviceInfo, ...]
    unhealthy: frozenset[str]  # device UUIDs tainted by the driver
    cpu_milli: int
    memory_mib: int
    #: device UUID -> the slice's device name (``gpu-<index>``)
    names: dict[str, str] = field(default_factory=dict)


def _attr(device: Mapping[str, Any], key: str) -> Any:
    value = (device.get("attributes") or {}).get(key) or {}
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def slice_node(resource_slice: Mapping[str, Any], node: Mapping[str, Any]) -> SliceNode:
    """One node's gpupool view from its slice and its Node object."""
    spec = resource_slice["spec"]
    devices, names, unhealthy = [], {}, set()
    for d in spec.get("devices") or []:
        uuid = str(_attr(d, "uuid") or f"{spec['nodeName']}-{d['name']}")
        memory = (d.get("capacity") or {}).get("memory", {}).get("value", "0")
        group = _attr(d, "nvlinkGroup")
        devices.append(
            DeviceInfo(
                uuid=uuid,
                index=int(_attr(d, "index") or 0),
                model=str(_attr(d, "productName") or _attr(d, "model") or "unknown"),
                memory_mib=int(quantity(str(memory)) // (1 << 20)),
                nvlink_group=None if group in (None, -1) else int(group),
            )
        )
        names[uuid] = str(d["name"])
        if d.get("taints"):
            unhealthy.add(uuid)
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return SliceNode(
        name=str(spec["nodeName"]),
        generation=int(spec["pool"]["generation"]),
        devices=tuple(devices),
        unhealthy=frozenset(unhealthy),
        cpu_milli=int(quantity(str(allocatable.get("cpu", "0"))) * 1000),
        memory_mib=int(quantity(str(allocatable.get("memory", "0"))) // (1 << 20)),
        names=names,
    )


def agent_id(node: str) -> str:
    return hashlib.sha256(f"gpupool-kube-bridge:{node}".encode()).hexdigest()[:32]


class PodNodes:
    """The Kubernetes nodes registered with gpupool, and their heartbeats."""

    def __init__(
        self, kube: KubeClient, server: str, agent_token: str, *, pool: str, timeout_s: float = 30
    ) -> None:
        self.kube = kube
        self.pool = pool
        self._http = httpx.Client(
            base_url=server.rstrip("/"),
            headers={"Authorization": f"Bearer {agent_token}", "User-Agent": "gpupool-kube"},
            timeout=timeout_s,
            verify=not server.startswith("http://"),
        )
        self.nodes: dict[str, SliceNode] = {}
        self.registered: dict[str, int] = {}  # node -> the generation registered
        self.epoch = 0

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: Any, node: str) -> dict[str, Any]:
        try:
            answer = self._http.post(
                path, content=body.model_dump_json(exclude_none=True),
                headers={"Content-Type": "application/json", "X-Gpupool-Node": node},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise AgentCallError(f"gpupool server unreachable ({path}): {exc}") from exc
        if answer.status_code >= 400:
            raise AgentCallError(f"gpupool server {path} for {node}: {answer.status_code} "
                                 f"{answer.text[:500]}")  # fmt: skip
        data = answer.json()
        assert isinstance(data, dict)
        return data

    def refresh(self) -> dict[str, SliceNode]:
        """Reads every gpupool slice and its Node; registers new and changed nodes."""
        slices = self.kube.list(self.kube.path_for(RESOURCE_API, "ResourceSlice"))
        ours = [s for s in slices if (s.get("spec") or {}).get("driver") == DRIVER]
        changed = any(
            self.registered.get(s["spec"].get("nodeName")) != s["spec"]["pool"]["generation"]
            for s in ours
        )
        if not changed and len(ours) == len(self.nodes):
            return self.nodes  # nothing new: no Node reads
        nodes = {n["metadata"]["name"]: n for n in self.kube.list("/api/v1/nodes")}
        seen: dict[str, SliceNode] = {}
        for s in ours:
            name = s["spec"].get("nodeName")
            if name in nodes:
                seen[name] = slice_node(s, nodes[name])
        self.nodes = seen
        for name, n in seen.items():
            if self.registered.get(name) != n.generation:
                self.register(n)
        return seen

    def register(self, n: SliceNode) -> None:
        request = RegisterRequest(
            node=n.name,
            cpu_milli=n.cpu_milli,
            memory_mib=n.memory_mib,
            devices=list(n.devices),
            agent_version=f"{__version__}+kube-bridge",
            isolation_modes=["shim"],
            labels={"gpupool.io/kubernetes": "true"},
            pool=self.pool,
            agent_id=agent_id(n.name),
        )
        answer = read_answer(RegisterResponse, self._post("/v1/agent/register", request, n.name))
        self.epoch = max(self.epoch, answer.epoch)
        self.registered[n.name] = n.generation
        log.info("registered Kubernetes node %s (%d GPU(s)) in pool %s",
                 n.name, len(n.devices), self.pool)  # fmt: skip

    def heartbeat(self, name: str, replicas: Iterable[ReplicaStatus]) -> HeartbeatResponse:
        n = self.nodes[name]
        telemetry = [DeviceTelemetry(uuid=u, healthy=False) for u in sorted(n.unhealthy)]
        request = HeartbeatRequest(
            node=name, epoch=self.epoch, telemetry=telemetry, replicas=list(replicas),
            agent_id=agent_id(name),
        )  # fmt: skip
        answer = read_answer(HeartbeatResponse, self._post("/v1/agent/heartbeat", request, name))
        if not answer.registered:
            self.registered.pop(name, None)
            self.register(n)
            return HeartbeatResponse(epoch=self.epoch, heartbeat_interval_s=1.0)
        self.epoch = max(self.epoch, answer.epoch)
        return answer
