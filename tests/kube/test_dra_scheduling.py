"""The real kube-scheduler places fractional GPU claims on the slices gpupool publishes.

A kwok node with one simulated A10 (22.5 GiB); gpupool's publisher puts its ResourceSlice on
the real API server; pods claim ``half-gpu-10gib`` (the example template: compute 500 milli-GPU and
10 GiB).
Two share the GPU; the third fits neither in compute nor in memory and stays Pending with the
scheduler's own reason, until one of the two is deleted.
"""

from __future__ import annotations

import uuid

import pytest

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.claims import quantity
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import DRIVER, device_class, slice_name
from tests.kube.cluster import ControlPlane
from tests.kube.diagnose import pod_report, wait_running
from tests.kube.objects import (
    claim_pod,
    condition,
    example,
    pod,
    pod_claim,
    wait_for,
)

FIELD_MANAGER = "gpupool-tests"


#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def _gpu_node(plane: ControlPlane, spec: str) -> tuple[str, SimulatedBackend, SlicePublisher]:
    """A kwok node with simulated GPUs ``spec`` and gpupool's publisher for it (not synced)."""
    node = f"kwok-{uuid.uuid4().hex[:8]}"
    plane.add_kwok_node(node)
    plane.client.apply(device_class(), field_manager=FIELD_MANAGER)
    backend = SimulatedBackend.from_spec(spec, node=node)
    return node, backend, SlicePublisher(plane.client, backend, node)


def _allocation(claim: dict) -> dict:
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    return dict(results[0])


def test_half_gpu_claims_share_one_gpu_and_the_third_waits(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    node, _, publisher = _gpu_node(control_plane, "1xA10")
    assert publisher.sync()
    stored = client.get(f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(node)}")
    assert stored["spec"]["nodeName"] == node
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0"]

    template = example("half-gpu-10gib.yaml", namespace)
    client.create(
        client.path_for("resource.k8s.io/v1", "ResourceClaimTemplate", namespace), template
    )
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("first", "second"):
        client.create(pods_path, claim_pod(name, namespace, "half-gpu-10gib", node))
    for name in ("first", "second"):
        assert wait_running(control_plane, namespace, name) == node

    shares = []
    for name in ("first", "second"):
        claim = pod_claim(client, namespace, name)
        assert claim is not None
        result = _allocation(claim)
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, node, "gpu-0")
        assert result["consumedCapacity"] == {"compute": "500", "memory": "10Gi"}
        shares.append(result["shareID"])
    assert len(set(shares)) == 2, "two claims on one GPU get two shares"

    client.create(pods_path, claim_pod("third", namespace, "half-gpu-10gib", node))

    def unschedulable() -> dict | None:
        c = condition(pod(client, namespace, "third"), "PodScheduled")
        return c if c and c.get("reason") == "Unschedulable" else None

    reason = wait_for(
        unschedulable, "the third pod reported unschedulable",
        explain=lambda: pod_report(control_plane, namespace, "third"),
    )  # fmt: skip
    assert "cannot allocate all claims" in reason["message"], reason
    assert pod(client, namespace, "third")["status"]["phase"] == "Pending"

    client.delete(f"{pods_path}/first", grace_period_s=0)
    assert wait_running(control_plane, namespace, "third") == node
    claim = pod_claim(client, namespace, "third")
    assert claim is not None
    assert _allocation(claim)["device"] == "gpu-0"


def test_two_whole_nvlinked_gpus_are_taken_together_and_whole(
    control_plane: ControlPlane, namespace: str
) -> None:

    client = control_plane.client
    # gpu-0: a T4 alone (nvlinkGroup -1); gpu-1 and gpu-2: two A100s joined by NVLink.
    node, _, publisher = _gpu_node(control_plane, "1xT4,2xA100-80GB")
    publisher.sync()
    templates = client.path_for("resource.k8s.io/v1", "ResourceClaimTemplate", namespace)
    for name in ("two-nvlinked-gpus.yaml", "half-gpu-10gib.yaml"):
        client.create(templates, example(name, namespace))
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    client.create(pods_path, claim_pod("pair", namespace, "two-nvlinked-gpus", node))
    assert wait_running(control_plane, namespace, "pair") == node
    claim = pod_claim(client, namespace, "pair")
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-1", "gpu-2"]
    consumed = [r.get("consumedCapacity") for r in results]
    # The whole of each: all 1000 milli-GPU ("1k" as the API writes it) and all the memory.
    assert [quantity(c["compute"]) for c in consumed] == [1000, 1000], consumed
    assert [quantity(c["memory"]) for c in consumed] == [80 << 30, 80 << 30], consumed

    # The pair took both A100s whole: a half-GPU claim can only go to the T4.
    client.create(pods_path, claim_pod("half", namespace, "half-gpu-10gib", node))
    assert wait_running(control_plane, namespace, "half") == node
    half = pod_claim(client, namespace, "half")
    assert half is not None
    assert _allocation(half)["device"] == "gpu-0"


def test_an_unhealthy_gpu_is_tainted_and_the_scheduler_keeps_new_claims_off_it(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    node, backend, publisher = _gpu_node(control_plane, "2xA10")
    publisher.sync()
    backend.inject_xid(backend.inventory()[0].uuid, 48)  # double-bit ECC: fatal
    assert publisher.sync()
    stored = client.get(f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(node)}")
    first, second = stored["spec"]["devices"]
    assert first["taints"][0]["key"] == "gpu.gpupool.io/unhealthy"
    assert first["taints"][0]["effect"] == "NoSchedule"
    assert "taints" not in second

    client.create(
        client.path_for("resource.k8s.io/v1", "ResourceClaimTemplate", namespace),
        example("half-gpu-10gib.yaml", namespace),
    )
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b"):
        client.create(pods_path, claim_pod(name, namespace, "half-gpu-10gib", node))
    for name in ("a", "b"):
        assert wait_running(control_plane, namespace, name) == node
        claim = pod_claim(client, namespace, name)
        assert claim is not None
        assert _allocation(claim)["device"] == "gpu-1"

    # gpu-1 is full: a third claim only fits on the tainted gpu-0.
    client.create(pods_path, claim_pod("c", namespace, "half-gpu-10gib", node))

    def unschedulable() -> dict | None:
        c = condition(pod(client, namespace, "c"), "PodScheduled")
        return c if c and c.get("reason") == "Unschedulable" else None

    reason = wait_for(
        unschedulable, "c unschedulable", explain=lambda: pod_report(control_plane, namespace, "c")
    )
    assert "cannot allocate all claims" in reason["message"], reason
