"""The kustomize base (deploy/kubernetes/) applied to the real API server by server-side apply.

Every object must be accepted by the real API server (schema, admission: PodSecurity, the
service account, priority classes); the controller manager then makes the DaemonSet's pod on
each kwok node and the Deployments' pods (the server's and the bridge's), the scheduler places
them (the server's volume bound to a PersistentVolume first) and kwok runs them. The bridge's
Secret of tokens is created as docs/kubernetes.md tells the user to, and its command line is
the one ``python -m gpupool.kube bridge`` parses.

There is no ``kubectl`` here, so the test renders the base itself, and only the two features
the base uses: ``resources`` and ``namespace``. A base that starts to use another kustomize
feature fails here, saying so, rather than being applied half-rendered.
"""

from __future__ import annotations

import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.kube.bridgemain import _parser as bridge_parser
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


def _bridge_tokens(client: KubeClient) -> None:
    """``kubectl create secret generic gpupool-bridge --from-file=admin-token=...
    --from-file=agent-token=...``, as docs/kubernetes.md says."""
    client.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gpupool-bridge", "namespace": NAMESPACE},
            "stringData": {"admin-token": "gp_admin_test", "agent-token": "gp_agent_test"},
        },
        field_manager="gpupool-deploy-test",
    )


def _bridge_command_parses(deployment: dict[str, Any]) -> None:
    """The container's command is the bridge's, its flags the bridge's parser takes, and the
    token files it names are the Secret volume's files."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "gpupool.kube", "bridge"]
    args = bridge_parser().parse_args(container["args"])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["GPUPOOL_SERVER"] == "http://gpupool-server:8470"  # the server's Service
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tokens")
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tokens"]
    files = {f"{mount['mountPath']}/{item['path']}" for item in volume["secret"]["items"]}
    assert {str(args.token_file), str(args.agent_token_file)} == files
    assert volume["secret"]["secretName"] == "gpupool-bridge"


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
    _bridge_tokens(client)

    def daemonset_running() -> bool:
        ds = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/gpupool-node")
        status = ds.get("status", {})
        desired = status.get("desiredNumberScheduled", 0)
        pods = _pods(client, "app.kubernetes.io/name=gpupool-node")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return bool(
            desired >= 1 and status.get("numberReady") == desired and len(running) == desired
        )

    wait_for(daemonset_running, "the DaemonSet's pods Running on every node")
    on_nodes = {p["spec"]["nodeName"] for p in _pods(client, "app.kubernetes.io/name=gpupool-node")}
    assert node in on_nodes

    def deployment_running(name: str) -> bool:
        dep = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
        pods = _pods(client, f"app.kubernetes.io/name={name}")
        ready = dep.get("status", {}).get("readyReplicas") == 1
        return ready and any(p["status"].get("phase") == "Running" for p in pods)

    kwok_nodes = {
        n["metadata"]["name"] for n in client.list("/api/v1/nodes", label_selector="type=kwok")
    }
    for name in ("gpupool-server", "gpupool-bridge"):
        wait_for(partial(deployment_running, name), f"the {name} Deployment's pod Running")
        (pod,) = _pods(client, f"app.kubernetes.io/name={name}")
        assert pod["spec"]["nodeName"] in kwok_nodes
    bridge = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpupool-bridge")
    assert bridge["spec"]["replicas"] == 1
    assert bridge["spec"]["template"]["spec"]["serviceAccountName"] == "gpupool-bridge"
    _bridge_command_parses(bridge)
    claim = client.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/gpupool-server-home")
    assert claim["status"]["phase"] == "Bound"
