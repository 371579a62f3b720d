"""The kustomize base (deploy/kubernetes/) applied to the real API server by server-side apply.

Every object must be accepted by the real API server (schema, admission: PodSecurity, the
service account, priority classes); the controller manager then makes the DaemonSet's pod on
each kwok node and the Deployment's pod, the scheduler places them (the server's volume bound
to a PersistentVolume first) and kwok runs them.

There is no ``kubectl`` here, so the test renders the base itself, and only the two features
the base uses: ``resources`` and ``namespace``. A base that starts to use another kustomize
feature fails here, saying so, rather than being applied half-rendered.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.kube.client import KubeClient
from tests.kube.cluster import ControlPlane
from tests.kube.objects import REPO_ROOT, wait_for

BASE = REPO_ROOT / "deploy" / "kubernetes"
NAMESPACE = "gpupool-system"
RENDERED_FIELDS = {"apiVersion", "kind", "resources", "namespace"}


#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def render(base: Path, client: KubeClient) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    unknown = set(kustomization) - RENDERED_FIELDS
    assert not unknown, f"the test renders only {sorted(RENDERED_FIELDS)}, not {sorted(unknown)}"
    objects = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((base / name).read_text()):
            if not doc:
                continue
            if client.resource(doc["apiVersion"], doc["kind"]).namespaced:
                doc["metadata"]["namespace"] = kustomization["namespace"]
            objects.append(doc)
    return objects


def _home_volume(client: KubeClient, folder: Path) -> None:
    """What a cluster's storage provisioner would do for the server's claim: a volume."""
    client.create(
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"gpupool-home-{uuid.uuid4().hex[:6]}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": str(folder)},
            },
        },
    )


def _pods(client: KubeClient, selector: str) -> list[dict[str, Any]]:
    return client.list(f"/api/v1/namespaces/{NAMESPACE}/pods", label_selector=selector)


def test_the_base_is_accepted_and_its_pods_run_on_kwok_nodes(
    control_plane: ControlPlane, tmp_path: Path
) -> None:

    client = control_plane.client
    node = f"kwok-deploy-{uuid.uuid4().hex[:6]}"
    control_plane.add_kwok_node(node)
    _home_volume(client, tmp_path)
    objects = render(BASE, client)
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
         "PersistentVolumeClaim", "Deployment", "Service", "DaemonSet"]
    )  # fmt: skip
    for obj in objects:
        applied = client.apply(obj, field_manager="gpupool-deploy-test")
        assert applied["metadata"]["name"] == obj["metadata"]["name"]
        assert applied["metadata"].get("uid"), f"{obj['kind']} {obj['metadata']['name']}"

    def daemonset_running() -> bool:
        ds = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/gpupool-node")
        status = ds.get("status", {})
        desired = status.get("desiredNumberScheduled", 0)
        pods = _pods(client, "app.kubernetes.io/name=gpupool-node")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return desired >= 1 and status.get("numberReady") == desired and len(running) == desired

    wait_for(daemonset_running, "the DaemonSet's pods Running on every node")
    on_nodes = {p["spec"]["nodeName"] for p in _pods(client, "app.kubernetes.io/name=gpupool-node")}
    assert node in on_nodes

    def deployment_running() -> bool:
        dep = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpupool-server")
        pods = _pods(client, "app.kubernetes.io/name=gpupool-server")
        return dep.get("status", {}).get("readyReplicas") == 1 and any(
            p["status"].get("phase") == "Running" for p in pods
        )

    wait_for(deployment_running, "the server Deployment's pod Running")
    (server,) = _pods(client, "app.kubernetes.io/name=gpupool-server")
    kwok_nodes = {
        n["metadata"]["name"] for n in client.list("/api/v1/nodes", label_selector="type=kwok")
    }
    assert server["spec"]["nodeName"] in kwok_nodes
    claim = client.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/gpupool-server-home")
    assert claim["status"]["phase"] == "Bound"
