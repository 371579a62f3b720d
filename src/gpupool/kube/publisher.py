"""Keeps a node's ResourceSlice equal to its GPUs, and says so when a GPU is lost.

:class:`SlicePublisher` reads the node's GPU backend (NVML, or simulated devices in tests and
demos), folds each sample through the agent's own health rules (``gpu.health.HealthTracker``:
fatal XIDs, lost GPUs, overheating) and server-side applies the node's one ResourceSlice
(:mod:`gpupool.kube.slices`) whenever what it would publish changes, with the pool's generation
one higher. A GPU that is lost is withdrawn from the slice (so the scheduler allocates nothing
more from it) and a ``Warning`` Event ``GpuLost`` is raised on the Node; an unhealthy one is
tainted ``NoSchedule``. A restarted publisher continues from the generation already stored.

Calls are synchronous; :meth:`SlicePublisher.run` loops until its stop event is set.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Any

from gpupool.agent.node import nvlink_groups
from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu.base import GpuBackend
from gpupool.gpu.health import HealthTracker
from gpupool.kube.client import KubeClient, KubeError
from gpupool.kube.health import HealthBoard
from gpupool.kube.slices import (
    DRIVER,
    RESOURCE_API,
    device_name,
    published_gpus,
    resource_slice,
    slice_name,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "gpupool-kube"


class SlicePublisher:
    """One node's slice, kept current. ``node`` is the Kubernetes Node name."""

    def __init__(
        self,
        client: KubeClient,
        backend: GpuBackend,
        node: str,
        *,
        driver: str = DRIVER,
        board: HealthBoard | None = None,
    ) -> None:
        self.client = client
        self.backend = backend
        self.node = node
        self.driver = driver
        self.board = board
        self.inventory = backend.inventory()
        self.groups = nvlink_groups(self.inventory)
        self.health = HealthTracker(self.inventory)
        self.generation: int | None = None
        self.lost: set[str] = set()
        self.unhealthy: dict[str, str] = {}
        self._published: list[dict[str, Any]] | None = None
        self._path = client.path_for(RESOURCE_API, "ResourceSlice")

    def sync(self) -> bool:
        """Sample, and apply the slice if what it shows changed; ``True`` when it applied."""
        telemetry = self.backend.sample()
        verdicts = self.health.update(telemetry)
        lost_now = {s.uuid for s in telemetry.devices if s.lost}
        newly_lost = lost_now - self.lost
        self.lost |= lost_now
        self.unhealthy = {
            uuid: v.reason or "unhealthy"
            for uuid, v in verdicts.items()
            if v.health == DeviceHealth.UNHEALTHY and uuid not in self.lost
        }
        if self.board is not None:
            self.board.update({device_name(d.index): self._verdict(d.uuid) for d in self.inventory})
        gpus = published_gpus(self.inventory, self.groups, lost=self.lost, unhealthy=self.unhealthy)
        devices = resource_slice(self.node, gpus, 0, driver=self.driver)["spec"]["devices"]
        for uuid in sorted(newly_lost):  # first: a failed apply below must not lose them
            self._event_lost(uuid)
        if devices == self._published:
            return False
        self._apply(devices)
        return True

    def _verdict(self, uuid: str) -> tuple[bool, str]:
        if uuid in self.lost:
            return False, "GPU lost (fallen off the bus or driver error)"
        if uuid in self.unhealthy:
            return False, self.unhealthy[uuid]
        return True, ""

    def _apply(self, devices: list[dict[str, Any]]) -> None:
        if self.generation is None:
            current = self.client.get_or_none(f"{self._path}/{slice_name(self.node, self.driver)}")
            stored = current["spec"] if current else None
            self.generation = int(stored["pool"]["generation"]) if stored else 0
            if stored is not None and stored.get("devices") == devices:
                self._published = devices
                return
        self.generation += 1
        gpus = published_gpus(self.inventory, self.groups, lost=self.lost, unhealthy=self.unhealthy)
        body = resource_slice(self.node, gpus, self.generation, driver=self.driver)
        owner = self._node_owner()
        if owner is not None:
            body["metadata"]["ownerReferences"] = [owner]
        self.client.apply(body, field_manager=FIELD_MANAGER)
        self._published = devices
        log.info(
            "published %d GPU(s) of node %s (pool generation %d)",
            len(devices),
            self.node,
            self.generation,
        )

    def _node_owner(self) -> dict[str, Any] | None:
        """The Node as the slice's owner, so that deleting the node deletes its slice."""
        node = self.client.get_or_none(f"/api/v1/nodes/{self.node}")
        if node is None:
            return None
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }

    def _event_lost(self, uuid: str) -> None:
        info = next((d for d in self.inventory if d.uuid == uuid), None)
        where = f"gpu-{info.index} ({uuid})" if info is not None else uuid
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node}.gpulost.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            "reason": "GpuLost",
            "message": (
                f"GPU {where} was lost (fallen off the bus or driver error): its capacity is "
                f"withdrawn from ResourceSlice {slice_name(self.node, self.driver)}; claims "
                "already on it must be rescheduled. Check the GPU (nvidia-smi, dmesg for Xid) "
                "and restart the gpupool plugin on the node once it is back."
            ),
            "type": "Warning",
            "source": {"component": self.driver, "host": self.node},
            "reportingComponent": self.driver,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.client.create("/api/v1/namespaces/default/events", event)
        except KubeError as exc:  # the slice is what matters; the event is for people
            log.warning("cannot raise the GpuLost event for %s: %s", where, exc)

    def withdraw(self) -> None:
        """Deletes the node's slice (the plugin is going away for good)."""
        self.client.delete(f"{self._path}/{slice_name(self.node, self.driver)}")
        self._published = None

    def run(self, stop: threading.Event, *, interval_s: float = 5.0) -> None:
        """Syncs every ``interval_s`` until ``stop``; API errors are logged and retried."""
        while not stop.is_set():
            try:
                self.sync()
            except KubeError as exc:
                log.warning("cannot publish the slice of node %s: %s", self.node, exc)
            stop.wait(interval_s)
