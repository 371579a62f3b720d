"""The kubelet plugin over its real gRPC sockets, called as the kubelet calls it.

The claim is a real one: the real scheduler allocated it from gpupool's slice on a kwok node.
The plugin reads it from the API server, creates the claim's shim region (the real region
library), writes the CDI spec and answers the CDI device; a restarted plugin still knows it;
unprepare removes both. The registration socket answers the plugin watcher's GetInfo; the
health stream turns a device UNHEALTHY when its GPU is lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from gpupool.kube.grpcapi import (
    DRA_SERVICE,
    HEALTH_SERVICE,
    REGISTRATION_SERVICE,
)
from gpupool.kube.proto import dra_v1_pb2 as dra
from gpupool.kube.proto import drahealth_v1_pb2 as health
from gpupool.kube.proto import registration_v1_pb2 as reg
from gpupool.kube.slices import DRIVER
from gpupool.runtime.shim import Region
from tests.kube.cluster import ControlPlane
from tests.kube.nodes import CONTEXT, Node, call, prepare, scheduled_claim
from tests.shim.helpers import Natives

GIB = 1 << 30


#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def test_prepare_makes_the_region_and_cdi_device_and_survives_a_restart(
    control_plane: ControlPlane, namespace: str, node: Node
) -> None:
    info = call(node.sockets.registry, REGISTRATION_SERVICE, "GetInfo", reg.InfoRequest(),
                 reg.PluginInfo)  # fmt: skip
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(node.sockets.dra))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    status = reg.RegistrationStatus(plugin_registered=True)
    call(node.sockets.registry, REGISTRATION_SERVICE, "NotifyRegistrationStatus", status,
         reg.RegistrationStatusResponse)  # fmt: skip
    assert node.plugin is not None
    assert node.plugin.registration.registered.is_set()

    claim = scheduled_claim(control_plane, namespace, node.name)
    uid = claim["metadata"]["uid"]
    request, answer = prepare(node, namespace, claim)
    result = answer.claims[uid]
    assert result.error == ""
    (device,) = result.devices
    allocated = claim["status"]["allocation"]["devices"]["results"][0]
    assert (device.pool_name, device.device_name) == (node.name, allocated["device"])
    assert list(device.request_names) == ["gpu"]
    assert device.share_id == allocated["shareID"]
    assert list(device.cdi_device_ids) == [f"gpu.gpupool.io/claim={uid}"]

    # The region holds the claim to exactly its share of the GPU it was allocated.
    gpu0 = node.backend.inventory()[int(allocated["device"].removeprefix("gpu-"))]
    prepared = node.plugin.dra.preparer.prepared[uid]  # type: ignore[union-attr]
    with Region.open(Path(prepared.region), build=node.natives.shim) as region:
        usage = region.read().device(gpu0.uuid)
    assert usage.mem_limit_bytes == 10 * GIB
    assert usage.sm_share_permille == 500
    assert usage.context_reserve_bytes == CONTEXT  # charged inside the claim, as the agent does

    spec = json.loads(Path(prepared.cdi_spec).read_text())
    assert spec["kind"] == "gpu.gpupool.io/claim"
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == uid
    env = dict(e.split("=", 1) for e in cdi_device["containerEdits"]["env"])
    assert env["GPUPOOL_CUDA_REGION"] == "/run/gpupool/region"
    assert env["CUDA_VISIBLE_DEVICES"] == gpu0.uuid
    assert env["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/gpupool/shim"
    mounts = {m["containerPath"]: m for m in cdi_device["containerEdits"]["mounts"]}
    assert mounts["/run/gpupool/region"]["hostPath"] == prepared.region
    assert mounts["/usr/local/gpupool/shim"]["hostPath"] == str(node.natives.shim.facade_dir)
    assert mounts["/usr/local/gpupool/driver/libcuda.so.1"]["hostPath"] == str(node.natives.fake)

    # A restarted plugin keeps the claim: the kubelet's retry gets the same answer.
    node.stop_plugin()
    node.start_plugin()
    again = call(node.sockets.dra, DRA_SERVICE, "NodePrepareResources", request,
                  dra.NodePrepareResourcesResponse)  # fmt: skip
    assert again == answer
    assert Path(prepared.region).exists()

    gone = call(
        node.sockets.dra, DRA_SERVICE, "NodeUnprepareResources",
        dra.NodeUnprepareResourcesRequest(claims=request.claims),
        dra.NodeUnprepareResourcesResponse,
    )  # fmt: skip
    assert gone.claims[uid].error == ""
    assert not Path(prepared.region).exists()
    assert not Path(prepared.cdi_spec).exists()
    node.stop_plugin()
    node.start_plugin()
    assert uid not in node.plugin.dra.preparer.prepared  # type: ignore[union-attr]


def test_a_claim_of_another_node_is_refused_with_why(
    control_plane: ControlPlane, namespace: str, node: Node
) -> None:
    answer = call(
        node.sockets.dra, DRA_SERVICE, "NodePrepareResources",
        dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace=namespace, uid="0000", name="nope")]
        ),
        dra.NodePrepareResourcesResponse,
    )  # fmt: skip
    assert "cannot read ResourceClaim" in answer.claims["0000"].error
    assert not list((node.folder / "state" / "regions").iterdir())


def test_a_lost_gpu_is_withdrawn_with_an_event_and_reported_unhealthy(
    control_plane: ControlPlane, node: Node
) -> None:

    client = control_plane.client
    with grpc.insecure_channel(f"unix://{node.sockets.dra}") as channel:
        watch = channel.unary_stream(
            f"/{HEALTH_SERVICE}/NodeWatchResources",
            request_serializer=health.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=health.NodeWatchResourcesResponse.FromString,
        )
        stream = watch(health.NodeWatchResourcesRequest(), timeout=120)
        first = next(stream)
        assert {d.device.device_name: d.health for d in first.devices} == {
            "gpu-0": health.HEALTHY,
            "gpu-1": health.HEALTHY,
        }
        lost = node.backend.inventory()[1]
        node.backend.lose(lost.uuid)
        assert node.publisher.sync()
        after = next(stream)
        states = {d.device.device_name: d for d in after.devices}
        assert states["gpu-1"].health == health.UNHEALTHY
        assert "lost" in states["gpu-1"].message
        assert states["gpu-0"].health == health.HEALTHY
        stream.cancel()

    stored = client.get(f"/apis/resource.k8s.io/v1/resourceslices/{node.name}-{DRIVER}")
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0"]
    assert stored["spec"]["pool"]["generation"] == 2
    events = client.list(
        "/api/v1/namespaces/default/events",
        field_selector=f"involvedObject.name={node.name},reason=GpuLost",
    )
    assert len(events) == 1
    assert lost.uuid in events[0]["message"]
    assert events[0]["type"] == "Warning"
    assert not node.publisher.sync(), "nothing changed: nothing applied, no second event"


def test_two_nvlinked_gpus_are_prepared_as_one_region_and_one_cdi_device(
    control_plane: ControlPlane, namespace: str, natives: Natives, tmp_path: Path
) -> None:
    node = Node(control_plane, natives, tmp_path, "2xA100-80GB")
    node.start_plugin()
    try:
        claim = scheduled_claim(control_plane, namespace, node.name, "two-nvlinked-gpus")
        uid = claim["metadata"]["uid"]
        _, answer = prepare(node, namespace, claim)
        result = answer.claims[uid]
        assert result.error == ""
        assert sorted(d.device_name for d in result.devices) == ["gpu-0", "gpu-1"]
        assert [list(d.cdi_device_ids) for d in result.devices] == [
            [f"gpu.gpupool.io/claim={uid}"],
            [],
        ]  # one CDI device carries the claim's one region, listed once
        assert node.plugin is not None
        prepared = node.plugin.dra.preparer.prepared[uid]
        gpus = node.backend.inventory()
        with Region.open(Path(prepared.region), build=natives.shim) as region:
            for gpu in gpus:  # whole GPUs: all the memory, no compute cap
                usage = region.read().device(gpu.uuid)
                assert usage.mem_limit_bytes == gpu.memory_mib << 20
                assert usage.sm_share_permille == 1000
        spec = json.loads(Path(prepared.cdi_spec).read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["CUDA_VISIBLE_DEVICES"].split(",") == [g.uuid for g in gpus]
    finally:
        node.stop_plugin()
