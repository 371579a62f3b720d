"""The pod -> job and placement -> object translations of the bridge (pure, no cluster).

Each job spec is checked by gpupool's own job-file parser (``build_spec``), so a pod the
bridge accepts is a job the server accepts; each refusal names what to change.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupool.domain.jobs import RequeuePolicy
from gpupool.domain.jobspec import build_spec
from gpupool.kube.claims import quantity
from gpupool.kube.podjobs import (
    ANNOTATION_GPU_TYPES,
    ANNOTATION_PREEMPTIBLE,
    ANNOTATION_PRIORITY,
    NO_CLAIM,
    DeviceShare,
    PodRef,
    PodRefused,
    allocation_status,
    job_spec,
    pod_claim_name,
    pod_of_command,
)

CLASSES = frozenset({"low", "normal", "high"})


def claim(count: int = 1, **capacity: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.gpupool.io", "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "metadata": {"name": "c", "namespace": "vision"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod(**spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    return {
        "metadata": {"name": "train", "namespace": "vision", "uid": "u-1",
                     "annotations": annotations},
        "spec": {
            "schedulerName": "gpupool",
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "500m"}}},
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            **spec,
        },
    }  # fmt: skip


def test_a_half_gpu_pod_is_a_job_of_its_namespace_with_its_share_and_grace() -> None:
    p = pod(
        terminationGracePeriodSeconds=45,
        activeDeadlineSeconds=7200,
        priorityClassName="high",
        nodeSelector={"kubernetes.io/hostname": "n1"},
        annotations={ANNOTATION_PREEMPTIBLE: "true", ANNOTATION_GPU_TYPES: "A100, H100"},
    )
    spec = job_spec(
        p, claim(compute="500", memory="10Gi"), pool="default", priority_classes=CLASSES
    )
    job = build_spec(spec)
    assert job.tenant == "vision"
    assert job.resources.gpu_milli == 500
    assert job.resources.gpu_memory_mib == 10 * 1024
    assert job.resources.cpu_milli == 2000
    assert job.resources.host_memory_mib == 2048
    assert job.resources.gpu_types == ("A100", "H100")
    assert job.priority_class == "high"
    assert job.preemptible is True
    assert job.requeue is RequeuePolicy.NEVER
    assert job.grace_period_s == 45
    assert job.time_limit_s == 7200
    assert job.nodelist == ("n1",)
    assert pod_of_command(job.command) == PodRef("vision", "train", "u-1")


def test_whole_gpus_a_cpu_pod_and_priorities() -> None:
    whole = build_spec(job_spec(pod(), claim(count=2), pool="p", priority_classes=CLASSES))
    assert whole.resources.gpu_milli == 2000
    no_claim = pod(resourceClaims=[])
    assert pod_claim_name(no_claim) == NO_CLAIM
    cpu = build_spec(job_spec(no_claim, None, pool="p", priority_classes=CLASSES))
    assert cpu.resources.gpu_milli == 0
    # a Kubernetes class gpupool does not have is not gpupool's; the annotation wins
    other = job_spec(pod(priorityClassName="system-node-critical"), claim(), pool="p",
                     priority_classes=CLASSES)  # fmt: skip
    assert "priority" not in other
    annotated = job_spec(pod(priorityClassName="low", annotations={ANNOTATION_PRIORITY: "high"}),
                         claim(), pool="p", priority_classes=CLASSES)  # fmt: skip
    assert annotated["priority"] == "high"


def test_a_template_claim_is_found_once_the_controller_made_it() -> None:
    p = pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "half"}])
    assert pod_claim_name(p) is None
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x"}]}
    assert pod_claim_name(p) == "train-gpu-x"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda p, c: p["spec"]["resourceClaims"].append({"name": "x"}), "2 resource claims"),
        (lambda p, c: c["spec"]["devices"]["requests"][0]["exactly"].update(
            selectors=[{"cel": {"expression": "true"}}]), ANNOTATION_GPU_TYPES),
        (lambda p, c: c["spec"]["devices"]["requests"][0]["exactly"].update(
            count=2, capacity={"requests": {"compute": "500"}}), "use count 1 for a share"),
        (lambda p, c: c["spec"]["devices"]["requests"][0]["exactly"].update(
            deviceClassName="gpu.nvidia.com"), "use gpu.gpupool.io"),
        (lambda p, c: p["spec"].update(nodeSelector={"zone": "a"}), "remove nodeSelector"),
        (lambda p, c: p["metadata"]["annotations"].update({ANNOTATION_PREEMPTIBLE: "yes"}),
         "use true/false"),
        (lambda p, c: c["spec"]["devices"]["requests"][0]["exactly"].update(
            capacity={"requests": {"memory": "10 gigs"}}), "not a Kubernetes quantity"),
    ],
)  # fmt: skip
def test_what_gpupool_cannot_honour_is_refused_with_what_to_change(change: Any, words: str) -> None:
    p, c = pod(), claim(compute="500", memory="10Gi")
    change(p, c)

    def translate() -> None:
        pod_claim_name(p)
        job_spec(p, c, pool="default", priority_classes=CLASSES)

    with pytest.raises(PodRefused, match=words):
        translate()


def test_the_allocation_is_written_as_the_kube_scheduler_writes_it() -> None:
    c = claim(compute="500", memory="10Gi")
    before = copy.deepcopy(c)
    status = allocation_status(
        c, "n1", [DeviceShare("gpu-1", 500, 10240)], PodRef("vision", "train", "u-1"), ["s-1"]
    )
    assert c == before  # the claim given is not changed
    (result,) = status["allocation"]["devices"]["results"]
    assert (result["request"], result["driver"], result["pool"], result["device"]) == (
        "gpu", "gpu.gpupool.io", "n1", "gpu-1",
    )  # fmt: skip
    assert result["shareID"] == "s-1"
    consumed = result["consumedCapacity"]
    assert (quantity(consumed["compute"]), quantity(consumed["memory"])) == (500, 10 << 30)
    term = status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    assert term["matchFields"][0]["values"] == ["n1"]
    assert status["reservedFor"] == [{"resource": "pods", "name": "train", "uid": "u-1"}]
