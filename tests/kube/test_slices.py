"""What gpupool publishes for a node's GPUs (pure: no API server)."""

from __future__ import annotations

from gpupool.agent.node import nvlink_groups
from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.slices import DRIVER, device_class, published_gpus, resource_slice


def test_each_gpu_is_a_shared_device_with_memory_and_compute_capacity() -> None:
    backend = SimulatedBackend.from_spec("2xA100-80GB,1xT4", node="n1")
    inventory = backend.inventory()
    gpus = published_gpus(inventory, nvlink_groups(inventory))
    body = resource_slice("n1", gpus, 3)
    spec = body["spec"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    first, _, t4 = spec["devices"]
    assert first["name"] == "gpu-0"
    assert first["allowMultipleAllocations"] is True
    assert first["attributes"]["model"] == {"string": "A100-80GB"}
    assert first["attributes"]["uuid"] == {"string": inventory[0].uuid}
    assert first["attributes"]["nvlinkGroup"] == {"int": 0}
    assert t4["attributes"]["nvlinkGroup"] == {"int": -1}
    memory = first["capacity"]["memory"]
    assert memory["value"] == f"{inventory[0].memory_mib}Mi"
    assert memory["requestPolicy"]["default"] == memory["value"]
    assert first["capacity"]["compute"]["value"] == "1000"


def test_a_lost_gpu_is_withdrawn_and_an_unhealthy_one_tainted() -> None:
    inventory = SimulatedBackend.from_spec("3xL4", node="n1").inventory()
    gpus = published_gpus(
        inventory,
        nvlink_groups(inventory),
        lost=[inventory[1].uuid],
        unhealthy={inventory[2].uuid: "fatal XID 48"},
    )
    devices = resource_slice("n1", gpus, 1)["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-2"]
    assert "taints" not in devices[0]
    assert devices[1]["taints"][0]["effect"] == "NoSchedule"


def test_the_device_class_selects_the_driver() -> None:
    cls = device_class()
    assert cls["spec"]["selectors"][0]["cel"]["expression"] == f'device.driver == "{DRIVER}"'
