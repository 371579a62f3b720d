"""What gpupool publishes to Kubernetes' Dynamic Resource Allocation: devices, slices, the class.

Pure: facts about a node's GPUs in (``gpu.base.DeviceInfo``), ``resource.k8s.io/v1`` objects out
(plain JSON dictionaries). :mod:`gpupool.kube.publisher` applies them to the API server.

Words:

- **driver**: the DRA driver name, ``gpu.gpupool.io``; every slice, device class and claim
  allocation carries it, and the kubelet finds the plugin by it.
- **pool**: one per node, named after the node; its ``generation`` goes up each time the set of
  published devices changes, so the scheduler never mixes two versions of a node's inventory.
- **device**: one physical GPU, named ``gpu-<index>``. It publishes two *consumable capacities*
  (``allowMultipleAllocations``: many claims share it, each consuming some):
  ``memory`` (bytes, as a quantity: ``80Gi``; a claim asks ``10Gi``) and ``compute`` (milli-GPU:
  the GPU is ``1000``; a claim asks ``500`` for half, in steps of 10). A request that names no
  capacity consumes the policy's default, the whole of it: ``count: 2`` with no capacity is two
  whole GPUs.
- **attributes**: ``model`` (``A100-80GB``), ``productName`` (NVML's name), ``uuid``, ``index``,
  ``nvlinkGroup`` (lowest index of the GPUs joined by NVLink; ``-1`` alone), ``migEnabled``,
  ``migInstances`` (count) and ``migProfiles`` (``1g.10gb,3g.40gb``, cut to the attribute
  limit), ``computeCapability`` (a version: ``8.0.0``).
- **lost** GPU: absent from the slice (withdrawn); an **unhealthy** one (fatal XID, too hot)
  stays listed with a ``NoSchedule`` taint, so nothing new lands on it and the reason shows.

The claim side never appears here: the real kube-scheduler allocates from these slices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.gpu.base import DeviceInfo
from gpupool.gpu.models import CATALOGUE

DRIVER = "gpu.gpupool.io"
DEVICE_CLASS = "gpu.gpupool.io"
RESOURCE_API = "resource.k8s.io/v1"
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
# The API's limit on a string attribute value.
ATTRIBUTE_STRING_MAX = 64
#: ``compute`` counts milli-GPUs (an integer, STYLE 5): 1000 is the whole GPU, a claim asks 500
#: for half. Integers, not ``500m`` of ``1``: with a fractional range the 1.37 scheduler
#: charged a ``500m`` request a whole ``1`` (fractional capacity ranges are behind the
#: ``DRAFractionalCapacityRange`` gate, off by default in 1.37).
COMPUTE_WHOLE = "1000"
COMPUTE_STEP = "10"


@dataclass(frozen=True)
class PublishedGpu:
    """One GPU as the slice shows it: its facts, its NVLink group and, if unhealthy, why."""

    info: DeviceInfo
    nvlink_group: int | None = None
    unhealthy: str | None = None

    @property
    def device_name(self) -> str:
        return device_name(self.info.index)


def device_name(index: int) -> str:
    return f"gpu-{index}"


def slice_name(node: str, driver: str = DRIVER) -> str:
    return f"{node}-{driver}"


def model_name(info: DeviceInfo) -> str:
    """gpupool's short model name (``A100-80GB``), or the product name when unknown."""
    for model in CATALOGUE.values():
        if info.name in (model.full_name, model.name):
            return model.name
    return info.name


def _attributes(gpu: PublishedGpu) -> dict[str, dict[str, Any]]:
    info = gpu.info
    attrs: dict[str, dict[str, Any]] = {
        "model": {"string": model_name(info)[:ATTRIBUTE_STRING_MAX]},
        "productName": {"string": info.name[:ATTRIBUTE_STRING_MAX]},
        "uuid": {"string": info.uuid[:ATTRIBUTE_STRING_MAX]},
        "index": {"int": info.index},
        "nvlinkGroup": {"int": -1 if gpu.nvlink_group is None else gpu.nvlink_group},
        "migEnabled": {"bool": bool(info.mig_enabled)},
        "migInstances": {"int": len(info.mig_instances)},
    }
    if info.mig_instances:
        profiles = ",".join(m.profile or f"{m.memory_mib}Mi" for m in info.mig_instances)
        attrs["migProfiles"] = {"string": profiles[:ATTRIBUTE_STRING_MAX]}
    if info.compute_capability is not None:
        major, minor = info.compute_capability
        attrs["computeCapability"] = {"version": f"{major}.{minor}.0"}
    return attrs


def _capacity(info: DeviceInfo) -> dict[str, dict[str, Any]]:
    memory = f"{info.memory_mib}Mi"
    return {
        "memory": {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "max": memory}},
        },
        "compute": {
            "value": COMPUTE_WHOLE,
            "requestPolicy": {
                "default": COMPUTE_WHOLE,
                "validRange": {"min": COMPUTE_STEP, "max": COMPUTE_WHOLE, "step": COMPUTE_STEP},
            },
        },
    }


def device_entry(gpu: PublishedGpu) -> dict[str, Any]:
    """One ``devices[]`` entry of a ResourceSlice."""
    entry: dict[str, Any] = {
        "name": gpu.device_name,
        "attributes": _attributes(gpu),
        "capacity": _capacity(gpu.info),
        "allowMultipleAllocations": True,
    }
    if gpu.unhealthy is not None:
        entry["taints"] = [
            {"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"},
        ]
    return entry


def resource_slice(
    node: str, gpus: Sequence[PublishedGpu], generation: int, *, driver: str = DRIVER
) -> dict[str, Any]:
    """The node's one ResourceSlice (its pool holds exactly this slice)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node, driver),
            "labels": {"app.kubernetes.io/managed-by": "gpupool", "gpupool.io/node": node},
        },
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device_entry(g) for g in sorted(gpus, key=lambda g: g.info.index)],
        },
    }


def device_class(name: str = DEVICE_CLASS, *, driver: str = DRIVER) -> dict[str, Any]:
    """The DeviceClass every gpupool claim names: any device of the driver."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def published_gpus(
    inventory: Iterable[DeviceInfo],
    groups: Mapping[str, int | None],
    *,
    lost: Iterable[str] = (),
    unhealthy: Mapping[str, str] | None = None,
) -> tuple[PublishedGpu, ...]:
    """The GPUs to publish: the inventory less ``lost`` UUIDs, unhealthy ones marked."""
    gone = set(lost)
    bad = dict(unhealthy or {})
    return tuple(
        PublishedGpu(info, groups.get(info.uuid), bad.get(info.uuid))
        for info in inventory
        if info.uuid not in gone
    )
