"""A kwok node with gpupool's slice publisher and kubelet plugin, and the kubelet's calls."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import grpc

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.grpcapi import DRA_SERVICE, KubeletPlugin, PluginSockets
from gpupool.kube.health import HealthBoard
from gpupool.kube.plugin import ClaimPreparer
from gpupool.kube.proto import dra_v1_pb2 as dra
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import device_class
from gpupool.runtime.shim import job_env
from tests.kube.cluster import ControlPlane
from tests.kube.diagnose import wait_running
from tests.kube.objects import claim_pod, example, pod_claim
from tests.shim.helpers import Natives

#: The context reserve the tests' plugin charges per process and GPU (bytes).
CONTEXT = 256 << 20


class Node:
    """A kwok node with gpupool's publisher and (re)startable kubelet plugin."""

    def __init__(
        self,
        plane: ControlPlane,
        natives: Natives,
        folder: Path,
        spec: str,
        *,
        cdi_dir: Path | None = None,
    ) -> None:
        self.plane = plane
        self.cdi_dir = cdi_dir or folder / "cdi"
        self.natives = natives
        self.folder = folder
        self.name = f"kwok-{uuid.uuid4().hex[:6]}"
        plane.add_kwok_node(self.name)
        plane.client.apply(device_class(), field_manager="gpupool-tests")
        self.backend = SimulatedBackend.from_spec(spec, node=self.name)
        self.board = HealthBoard()
        self.publisher = SlicePublisher(plane.client, self.backend, self.name, board=self.board)
        self.publisher.sync()
        self.sockets = PluginSockets(dra=folder / "dra.sock", registry=folder / "reg.sock")
        self.plugin: KubeletPlugin | None = None

    def start_plugin(self) -> KubeletPlugin:
        def shim_env(region: Path) -> dict[str, str]:
            return job_env(
                region, self.natives.fake, real_nvml=self.natives.fake_nvml,
                build=self.natives.shim,
            )  # fmt: skip

        preparer = ClaimPreparer(
            self.plane.client, self.name, self.backend.inventory(),
            state_dir=self.folder / "state", cdi_dir=self.cdi_dir, shim_env=shim_env,
            context_reserves=dict.fromkeys((d.uuid for d in self.backend.inventory()), CONTEXT),
        )  # fmt: skip
        self.plugin = KubeletPlugin(preparer, self.board, self.sockets)
        self.plugin.start()
        return self.plugin

    def stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None


def call(socket: Path, service: str, method: str, request: Any, response_type: Any) -> Any:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return call(request, timeout=60)


def scheduled_claim(
    plane: ControlPlane, namespace: str, node: str, template: str = "half-gpu-10gib"
) -> dict[str, Any]:
    """The claim of a pod using the example ``template``, once the scheduler placed the pod."""
    client = plane.client
    client.create(
        client.path_for("resource.k8s.io/v1", "ResourceClaimTemplate", namespace),
        example(f"{template}.yaml", namespace),
    )
    client.create(
        f"/api/v1/namespaces/{namespace}/pods", claim_pod("app", namespace, template, node)
    )
    wait_running(plane, namespace, "app", "the pod running")
    claim = pod_claim(client, namespace, "app")
    assert claim is not None
    return claim


def prepare(node: Node, namespace: str, claim: dict[str, Any]) -> tuple[Any, Any]:
    """``NodePrepareResources`` of ``claim`` on the node's DRA socket: (request, answer)."""
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    request = dra.NodePrepareResourcesRequest(
        claims=[dra.Claim(namespace=namespace, uid=uid, name=name)]
    )
    answer = call(node.sockets.dra, DRA_SERVICE, "NodePrepareResources", request,
                  dra.NodePrepareResourcesResponse)  # fmt: skip
    return request, answer
