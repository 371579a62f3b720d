"""Pods as jobs of gpupool, and gpupool's decisions as Kubernetes objects (pure).

The bridge (:mod:`gpupool.kube.bridge`) hands pods with ``schedulerName: gpupool`` to gpupool's
own scheduler. This module holds the two translations it needs, with no I/O:

- **pod -> job**: :func:`job_spec` turns a pod and its one gpupool ResourceClaim into a job file
  mapping (the same form ``gpupool submit`` sends): the namespace is the job's tenant, the claim's
  ``count`` and ``capacity.requests`` (``compute`` in milli-GPU, ``memory`` in bytes) are the
  request per replica, the pod's CPU and memory requests are the job's, its priority is the
  ``gpupool.io/priority`` annotation or else its ``priorityClassName`` when gpupool has a class
  of that name, ``gpupool.io/preemptible: "true"`` makes it preemptible, a
  ``kubernetes.io/hostname`` node selector is its ``nodelist`` (other selectors and affinity
  are refused, not ignored), ``activeDeadlineSeconds`` its time limit, and its
  ``terminationGracePeriodSeconds`` the checkpoint grace (Kubernetes sends SIGTERM, the
  checkpoint signal, and kills after the grace). The job never requeues: a preempted pod is
  gone, and its controller (a Job, a Deployment) makes a new pod, so a new job.
- **placement -> objects**: :func:`allocation_status` is the ResourceClaim status gpupool's
  start order becomes (the device results with their consumed capacity and share IDs, the node
  selector, the pod reserved), exactly what the kube-scheduler would have written, so the
  kubelet plugin prepares it the same way; :func:`binding` binds the pod to the node;
  :func:`pending_condition` mirrors gpupool's pending reason onto the pod.

Words: **job command** of a pod's job is ``["kubernetes-pod", namespace, name, uid]``: nothing
runs it (the kubelet runs the pod); the bridge reads the pod back from it after a restart.
What a pod asks that gpupool cannot honour (two gpupool claims, CEL selectors, a fraction of
several GPUs) raises :class:`PodRefused` with what to change; such a pod is never submitted.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.domain.errors import GpupoolError
from gpupool.domain.units import MILLI_PER_GPU
from gpupool.kube.claims import ClaimError, quantity
from gpupool.kube.slices import DEVICE_CLASS, DRIVER

SCHEDULER_NAME = "gpupool"
JOB_COMMAND = "kubernetes-pod"
#: The gpupool job of a pod (set by the bridge once submitted).
ANNOTATION_JOB = "gpupool.io/job"
#: The assignment a bound pod runs (set by the bridge before it binds).
ANNOTATION_ASSIGNMENT = "gpupool.io/assignment"
ANNOTATION_PRIORITY = "gpupool.io/priority"
ANNOTATION_PREEMPTIBLE = "gpupool.io/preemptible"
#: GPU models the pod may run on, comma separated (gpupool's ``gpu_types``), e.g. ``A100,V100``.
ANNOTATION_GPU_TYPES = "gpupool.io/gpu-types"
#: The reason in the PodScheduled condition and the Events the bridge writes.
REASON_PENDING = "GpupoolPending"
REASON_REFUSED = "GpupoolRefused"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Kubernetes' default ``terminationGracePeriodSeconds``.
DEFAULT_GRACE_S = 30
#: gpupool's bound on a checkpoint grace.
MAX_GRACE_S = 3600


#: :func:`pod_claim_name` of a pod that holds no claim: gpupool places it as a CPU job.
NO_CLAIM = ""


class PodRefused(GpupoolError):
    """A pod gpupool cannot schedule as written; the message says what to change."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        meta = pod.get("metadata") or {}
        return cls(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class GpuRequest:
    """A claim's one request: ``count`` devices, each ``compute_milli`` (``None``: whole) and
    ``memory_bytes`` (``None``: gpupool's default for the share)."""

    name: str
    count: int
    compute_milli: int | None
    memory_bytes: int | None

    @property
    def gpus(self) -> str:
        """As a job file's ``resources.gpus``."""
        if self.compute_milli is None or self.compute_milli >= MILLI_PER_GPU:
            return str(self.count)
        return f"{self.compute_milli}m"


def pod_claim_name(pod: Mapping[str, Any]) -> str | None:
    """The name of the pod's one ResourceClaim object (its own, or the one the controller
    manager made from its template: ``None`` until then), :data:`NO_CLAIM` for a pod without
    one (a CPU job). Raises :class:`PodRefused` when the pod has several."""
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if len(entries) > 1:
        raise PodRefused(
            f"pod {PodRef.of(pod)} has {len(entries)} resource claims: a pod scheduled by "
            "gpupool has one (a claim of DeviceClass gpu.gpupool.io), or none (a CPU job)"
        )
    if not entries:
        return NO_CLAIM
    entry = entries[0]
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == entry.get("name") and status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    return None


def gpu_request(claim: Mapping[str, Any]) -> GpuRequest:
    """The claim's one request of gpupool's DeviceClass (validated)."""
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    if len(requests) != 1 or not isinstance(requests[0].get("exactly"), dict):
        raise PodRefused(
            f"{where}: gpupool schedules a claim with exactly one request of the form "
            "'exactly' (no firstAvailable): split it or let the kube-scheduler place it"
        )
    exactly = requests[0]["exactly"]
    if exactly.get("deviceClassName") != DEVICE_CLASS:
        raise PodRefused(f"{where}: its request names DeviceClass "
                         f"{exactly.get('deviceClassName')!r}: use {DEVICE_CLASS}")  # fmt: skip
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        raise PodRefused(f"{where}: allocationMode All is not scheduled by gpupool: give count")
    if exactly.get("selectors"):
        raise PodRefused(
            f"{where}: CEL selectors are not evaluated by gpupool: remove them and name GPU "
            f"models in the pod's {ANNOTATION_GPU_TYPES} annotation (e.g. A100,H100)"
        )
    count = int(exactly.get("count", 1))
    wanted = ((exactly.get("capacity") or {}).get("requests")) or {}
    unknown = set(wanted) - {"compute", "memory"}
    if unknown:
        raise PodRefused(f"{where}: unknown capacity {sorted(unknown)}: use compute and memory")
    try:
        compute = None if "compute" not in wanted else int(quantity(str(wanted["compute"])))
        memory = None if "memory" not in wanted else math.ceil(quantity(str(wanted["memory"])))
    except ClaimError as exc:
        raise PodRefused(f"{where}: {exc}") from exc
    if compute is not None and not 1 <= compute <= MILLI_PER_GPU:
        raise PodRefused(f"{where}: compute {compute} is not 1 to 1000 milli-GPU of one GPU")
    if count < 1 or (count > 1 and compute is not None and compute < MILLI_PER_GPU):
        raise PodRefused(
            f"{where}: count {count} with compute {compute}: gpupool gives a share of one GPU "
            "or whole GPUs; use count 1 for a share, or leave compute out for whole GPUs"
        )
    return GpuRequest(str(requests[0].get("name")), count, compute, memory)


def _container_requests(pod: Mapping[str, Any], key: str) -> list[str]:
    containers = (pod.get("spec") or {}).get("containers") or []
    return [
        str(c["resources"]["requests"][key])
        for c in containers
        if key in ((c.get("resources") or {}).get("requests") or {})
    ]


def job_spec(
    pod: Mapping[str, Any],
    claim: Mapping[str, Any] | None,
    *,
    pool: str,
    priority_classes: Collection[str],
) -> dict[str, Any]:
    """The job file mapping of ``pod`` holding ``claim`` (``None``: no claim, a CPU job; see
    the module docstring)."""
    ref = PodRef.of(pod)
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    resources: dict[str, Any] = {"gpus": "0"}
    if claim is not None:
        request = gpu_request(claim)
        resources["gpus"] = request.gpus
        if request.memory_bytes is not None:
            resources["gpu_memory"] = f"{math.ceil(request.memory_bytes / (1 << 20))}MiB"
    try:
        cpu = sum(quantity(q) for q in _container_requests(pod, "cpu"))
        memory = sum(quantity(q) for q in _container_requests(pod, "memory"))
    except ClaimError as exc:
        raise PodRefused(f"pod {ref}: {exc}") from exc
    resources["cpus"] = f"{math.ceil(cpu * 1000)}m"
    if memory:
        resources["memory"] = f"{math.ceil(memory / (1 << 20))}MiB"
    types = [t.strip() for t in str(annotations.get(ANNOTATION_GPU_TYPES, "")).split(",")]
    if any(types):
        resources["gpu_types"] = [t for t in types if t]
    selector = dict(spec.get("nodeSelector") or {})
    host = selector.pop(HOSTNAME_LABEL, None)
    if selector or spec.get("affinity") or spec.get("nodeName"):
        raise PodRefused(
            f"pod {ref}: gpupool places pods by its own rules and honours only the "
            f"{HOSTNAME_LABEL} node selector: remove nodeSelector {sorted(selector)}, affinity "
            "and nodeName, or name GPU models in the " + ANNOTATION_GPU_TYPES + " annotation"
        )
    grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    out: dict[str, Any] = {
        "name": ref.name,
        "tenant": ref.namespace,
        "pool": pool,
        "command": [JOB_COMMAND, ref.namespace, ref.name, ref.uid],
        "resources": resources,
        "requeue": "never",
        "isolation": "shim",
        "checkpoint": {"signal": "SIGTERM", "grace": f"{min(int(grace), MAX_GRACE_S)}s"},
    }
    if host:
        out["nodelist"] = [str(host)]
    if spec.get("activeDeadlineSeconds"):  # gpupool's time limit: backfill plans with it
        out["time_limit"] = f"{int(spec['activeDeadlineSeconds'])}s"
    priority = annotations.get(ANNOTATION_PRIORITY) or (
        spec.get("priorityClassName") if spec.get("priorityClassName") in priority_classes else None
    )
    if priority:
        out["priority"] = str(priority)
    preemptible = str(annotations.get(ANNOTATION_PREEMPTIBLE, "")).strip().lower()
    if preemptible not in ("", "true", "false"):
        raise PodRefused(f"pod {ref}: {ANNOTATION_PREEMPTIBLE} is {preemptible!r}: use true/false")
    if preemptible == "true":
        out["preemptible"] = True
    return out


def pod_of_command(command: Sequence[str]) -> PodRef | None:
    """The pod a job's command names, ``None`` for a job that is not a pod's."""
    if len(command) == 4 and command[0] == JOB_COMMAND:
        return PodRef(command[1], command[2], command[3])
    return None


@dataclass(frozen=True)
class DeviceShare:
    """One device of a start order as the claim's result: its slice entry ``device``
    (``gpu-<index>``), ``milli`` compute and ``memory_mib``."""

    device: str
    milli: int
    memory_mib: int


def allocation_status(
    claim: Mapping[str, Any],
    node: str,
    shares: Sequence[DeviceShare],
    pod: PodRef,
    share_ids: Sequence[str],
) -> dict[str, Any]:
    """The claim's ``status`` with gpupool's placement written as the kube-scheduler writes
    an allocation (the claim's other status fields kept)."""
    request = gpu_request(claim)
    results = [
        {
            "request": request.name,
            "driver": DRIVER,
            "pool": node,
            "device": share.device,
            "shareID": share_id,
            "consumedCapacity": {"compute": str(share.milli), "memory": f"{share.memory_mib}Mi"},
        }
        for share, share_id in zip(shares, share_ids, strict=True)
    ]
    status = dict(claim.get("status") or {})
    status["allocation"] = {
        "devices": {"results": results},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
    status["reservedFor"] = [{"resource": "pods", "name": pod.name, "uid": pod.uid}]
    return status


def binding(pod: PodRef, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def pending_condition(reason: str, message: str, now: str) -> dict[str, Any]:
    """The pod's ``PodScheduled`` condition while gpupool keeps it waiting."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now,
    }


def priority_names(classes: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(str(c.get("name")) for c in classes)
