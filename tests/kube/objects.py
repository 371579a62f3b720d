"""Test-side helpers for Kubernetes objects: the examples, pods with claims, waits on them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpupool.kube.client import KubeClient

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "deploy" / "kubernetes" / "examples"

#: Scheduling, claim allocation and kwok's status updates on a loaded 2-core machine. Past the
#: scheduler's own 5-minute flush of unschedulable pods, its fallback when no event requeues one.
WAIT_S = 420.0

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    *,
    timeout_s: float = WAIT_S,
    explain: Callable[[], str] | None = None,
) -> T:
    """Polls ``probe`` until it returns a true value; a failsafe deadline, not a speed test.

    ``explain``: what the cluster says about why it was not reached (``diagnose.pod_report``),
    added to the failure, so that a wait that times out on a loaded machine says why."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    why = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"{what}: not reached after {timeout_s:.0f} s (last: {last!r}){why}")


def example(name: str, namespace: str | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict)
    if namespace is not None:
        doc.setdefault("metadata", {})["namespace"] = namespace
    return doc


def claim_pod(name: str, namespace: str, template: str, node: str) -> dict[str, Any]:
    """A pod whose one container uses one claim made from ``template``, kept to ``node`` (the
    session's cluster holds other tests' nodes too)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


def pod(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def pod_claim(client: KubeClient, namespace: str, pod_name: str) -> dict[str, Any] | None:
    """The ResourceClaim the controller manager made for the pod's one claim, if any yet."""
    statuses = pod(client, namespace, pod_name).get("status", {}).get("resourceClaimStatuses")
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    return client.get(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
        f"{statuses[0]['resourceClaimName']}"
    )


def running_on(client: KubeClient, namespace: str, name: str) -> str | None:
    """The node of a pod kwok reports Running, else ``None``."""
    p = pod(client, namespace, name)
    if p.get("status", {}).get("phase") == "Running":
        return str(p["spec"].get("nodeName"))
    return None
