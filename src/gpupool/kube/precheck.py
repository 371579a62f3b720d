"""``gpupool precheck --kubernetes``: is this cluster (and node) ready for gpupool's DRA driver?

Each check answers ``(name, status, detail, fix)`` with status ``PASS``, ``WARN``, ``FAIL`` or
``SKIP`` (the CLI prints them beside its own checks). They run in order and later ones are
skipped when the API server cannot be reached:

- ``k8s-api``: the API server answers with these credentials (``$KUBECONFIG``, the pod's
  service account, ``~/.kube/config``) and its version;
- ``k8s-dra``: ``resource.k8s.io/v1`` is served (ResourceSlices, DeviceClasses: 1.34+);
- ``k8s-capacity``: consumable capacity is on: a server-side dry run of a shared device with a
  capacity policy keeps both (an API server with ``DRAConsumableCapacity`` off drops them, and
  every claim would then take a whole GPU);
- ``k8s-class``: the ``gpu.gpupool.io`` DeviceClass exists (the deployment applied);
- ``k8s-plugin``: on a node (``$NODE_NAME``, else the host name): the kubelet plugin's
  registration socket answers with gpupool's driver and the node's ResourceSlice is published;
- ``cdi``: a CDI spec folder exists on this machine (``/etc/cdi`` or ``/var/run/cdi``), which
  the container runtime reads the plugin's specs from;
- ``cdi-runtime``: the node's containerd or CRI-O has CDI on and reads ``/var/run/cdi``
  (:mod:`gpupool.kube.noderuntime`);
- ``nvidia-runtime``: NVIDIA's Container Toolkit as found (not needed by gpupool's claims), and
  a warning when its runtime would hand every GPU to a container outside any claim.

The last three read the node's files under ``GPUPOOL_HOST_ROOT`` (default ``/``; in a pod, the
node's root mounted there) and need no API server.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.domain.errors import GpupoolError
from gpupool.kube import noderuntime
from gpupool.kube.client import KubeClient, KubeConfig, KubeError
from gpupool.kube.slices import DEVICE_CLASS, DRIVER, RESOURCE_API, slice_name

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
KUBELET_DIR = Path(os.environ.get("GPUPOOL_KUBELET_DIR", "/var/lib/kubelet"))
APPLY = "kubectl apply --server-side -k deploy/kubernetes/"


@dataclass(frozen=True)
class KubeCheck:
    name: str
    status: str  # PASS, WARN, FAIL, SKIP
    detail: str
    fix: str = ""


@dataclass
class KubeContext:
    client: KubeClient | None = None
    node: str = field(default_factory=lambda: os.environ.get("NODE_NAME") or socket.gethostname())
    #: The node's root file system as this process sees it (``/``, or ``/host`` in a pod).
    host_root: Path = field(default_factory=lambda: Path(os.environ.get("GPUPOOL_HOST_ROOT", "/")))


def check_api(ctx: KubeContext) -> KubeCheck:
    try:
        ctx.client = KubeClient(KubeConfig.load(), timeout_s=15)
        version = ctx.client.get("/version")
    except (GpupoolError, OSError) as exc:
        ctx.client = None
        return KubeCheck(
            "k8s-api", "FAIL", str(exc),
            "set KUBECONFIG to a kubeconfig for the cluster (or run in a pod with a service "
            "account)",
        )  # fmt: skip
    return KubeCheck(
        "k8s-api", "PASS", f"{ctx.client.config.server} answers: {version.get('gitVersion')}"
    )


def check_dra(ctx: KubeContext) -> KubeCheck:
    assert ctx.client is not None
    try:
        ctx.client.resource(RESOURCE_API, "ResourceSlice")
        ctx.client.resource(RESOURCE_API, "DeviceClass")
    except KubeError as exc:
        return KubeCheck(
            "k8s-dra", "FAIL", str(exc),
            "gpupool needs Kubernetes 1.34 or newer (resource.k8s.io/v1, Dynamic Resource "
            "Allocation)",
        )  # fmt: skip
    return KubeCheck("k8s-dra", "PASS", f"{RESOURCE_API} served (ResourceSlice, DeviceClass)")


def _probe_slice() -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": "gpupool-precheck"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "gpupool-precheck", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": "1Gi",
                            "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Mi"}},
                        }
                    },
                }
            ],
        },
    }


def check_capacity(ctx: KubeContext) -> KubeCheck:
    assert ctx.client is not None
    path = ctx.client.path_for(RESOURCE_API, "ResourceSlice") + "?dryRun=All"
    try:
        answer = ctx.client.create(path, _probe_slice())
    except KubeError as exc:
        return KubeCheck("k8s-capacity", "FAIL", f"a dry-run shared device was refused: {exc}")
    device = answer.get("spec", {}).get("devices", [{}])[0]
    kept = device.get("allowMultipleAllocations") and device.get("capacity", {}).get(
        "memory", {}
    ).get("requestPolicy")
    if not kept:
        return KubeCheck(
            "k8s-capacity", "FAIL",
            "the API server dropped allowMultipleAllocations/requestPolicy: consumable capacity "
            "is off, so every claim would take a whole GPU",
            "turn on the DRAConsumableCapacity feature gate (on by default since 1.36) on "
            "kube-apiserver, kube-scheduler and kube-controller-manager",
        )  # fmt: skip
    return KubeCheck("k8s-capacity", "PASS", "consumable capacity on (shared devices kept)")


def check_class(ctx: KubeContext) -> KubeCheck:
    assert ctx.client is not None
    path = ctx.client.path_for(RESOURCE_API, "DeviceClass") + f"/{DEVICE_CLASS}"
    if ctx.client.get_or_none(path) is None:
        return KubeCheck(
            "k8s-class", "FAIL", f"no DeviceClass {DEVICE_CLASS}: gpupool is not deployed", APPLY
        )
    return KubeCheck("k8s-class", "PASS", f"DeviceClass {DEVICE_CLASS} present")


def check_plugin(ctx: KubeContext) -> KubeCheck:
    assert ctx.client is not None
    registration = KUBELET_DIR / "plugins_registry" / f"{DRIVER}-reg.sock"
    fix = (
        f"run the gpupool-node DaemonSet on node {ctx.node} ({APPLY}; check its pod's log), "
        "or set NODE_NAME to this node's name"
    )
    if not registration.exists():
        return KubeCheck("k8s-plugin", "FAIL", f"no plugin socket {registration}", fix)
    from gpupool.kube.grpcapi import registration_info

    try:
        name = registration_info(registration)
    except GpupoolError as exc:
        return KubeCheck("k8s-plugin", "FAIL", str(exc), fix)
    if name != DRIVER:
        return KubeCheck("k8s-plugin", "FAIL", f"{registration} answers as {name!r}", fix)
    path = ctx.client.path_for(RESOURCE_API, "ResourceSlice") + f"/{slice_name(ctx.node)}"
    found = ctx.client.get_or_none(path)
    if found is None:
        return KubeCheck(
            "k8s-plugin", "FAIL", f"the plugin answers but node {ctx.node} has no slice", fix
        )
    count = len(found.get("spec", {}).get("devices") or [])
    return KubeCheck(
        "k8s-plugin", "PASS", f"plugin registered at {registration}; {count} GPU(s) published"
    )


def check_cdi(ctx: KubeContext) -> KubeCheck:
    present = [d for d in CDI_DIRS if (ctx.host_root / d.relative_to("/")).is_dir()]
    if not present:
        return KubeCheck(
            "cdi", "FAIL", "no CDI spec folder (/etc/cdi, /var/run/cdi) on this machine",
            "enable CDI in the container runtime (containerd 2.0+ and CRI-O 1.28+ have it on; "
            "containerd 1.7: enable_cdi = true in its CRI plugin section) and create "
            "/var/run/cdi",
        )  # fmt: skip
    return KubeCheck("cdi", "PASS", "CDI spec folder " + ", ".join(str(d) for d in present))


def check_cdi_runtime(ctx: KubeContext) -> KubeCheck:
    found = noderuntime.cdi_runtime(ctx.host_root)
    return KubeCheck("cdi-runtime", found.status, found.detail, found.fix)


def check_nvidia_runtime(ctx: KubeContext) -> KubeCheck:
    found = noderuntime.nvidia_toolkit(ctx.host_root)
    return KubeCheck("nvidia-runtime", found.status, found.detail, found.fix)


#: Every check in order; those in ``NEEDS_API`` need the API server.
KUBE_CHECKS: dict[str, Callable[[KubeContext], KubeCheck]] = {
    "k8s-api": check_api,
    "k8s-dra": check_dra,
    "k8s-capacity": check_capacity,
    "k8s-class": check_class,
    "k8s-plugin": check_plugin,
    "cdi": check_cdi,
    "cdi-runtime": check_cdi_runtime,
    "nvidia-runtime": check_nvidia_runtime,
}
NEEDS_API = ("k8s-dra", "k8s-capacity", "k8s-class", "k8s-plugin")


def run_checks() -> list[KubeCheck]:
    ctx = KubeContext()
    results = []
    try:
        for name, check in KUBE_CHECKS.items():
            if name in NEEDS_API and ctx.client is None:
                results.append(KubeCheck(name, "SKIP", "the API server cannot be reached"))
                continue
            results.append(check(ctx))
    finally:
        if ctx.client is not None:
            ctx.client.close()
    return results
