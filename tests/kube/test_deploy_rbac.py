"""The bridge's ServiceAccount (deploy/kubernetes/rbac.yaml) may do exactly what the bridge
calls, and nothing more, as the real API server's RBAC authorizer answers.

The base's namespace and RBAC are applied by server-side apply, then the API server is asked
with SubjectAccessReviews, as the account ``system:serviceaccount:gpupool-system:gpupool-bridge``
(with the groups every service account's token carries):

- each call of ``gpupool/kube/bridge.py`` and ``podnodes.py`` (:data:`BRIDGE_CALLS`) is allowed;
- every verb on every resource and subresource the server's discovery lists (and the DRA
  synthetic subresources, which discovery does not list) is asked, cluster-wide: what the
  bridge may do beyond :data:`BRIDGE_CALLS` is only what any service account of no role may
  also do (``selfsubjectaccessreviews`` and the like), so the ClusterRole grants nothing more;
- named things it must never do (read secrets, delete nodes or pods, write a claim's spec or
  its devices' status, impersonate, bind roles) are denied, in its own namespace too;
- and the real bridge, run with a token of that account alone (a TokenRequest, as the pod's
  projected token), registers a node, binds a pod with its claim allocated and evicts it when
  gpupool cancels its job, with no call refused.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube.client import KubeClient
from tests.kube.brains import Brains
from tests.kube.cluster import ControlPlane
from tests.kube.diagnose import wait_running
from tests.kube.objects import pod_claim, wait_for
from tests.kube.test_bridge import create_pods, gpupool_pod, job_of
from tests.kube.test_deploy_base import BASE, NAMESPACE, render

pytestmark = pytest.mark.timeout(900)

ACCOUNT = "gpupool-bridge"
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")

#: (group, resource, verb): each call the bridge makes (grep ``self.kube`` in gpupool/kube).
BRIDGE_CALLS = {
    ("", "pods", "list"),  # every pod of schedulerName gpupool, all namespaces
    ("", "pods", "patch"),  # the gpupool.io/job and gpupool.io/assignment annotations
    ("", "pods/status", "patch"),  # PodScheduled=False with gpupool's pending reason
    ("", "pods/binding", "create"),  # a pod onto the node gpupool chose
    ("", "pods/eviction", "create"),  # preemption, cancel, time limit
    ("", "events", "create"),  # GpupoolPending, GpupoolRefused, GpupoolPreempt
    ("", "nodes", "list"),  # CPU and memory of the nodes it registers
    ("resource.k8s.io", "resourceslices", "list"),  # the GPUs gpupool published
    ("resource.k8s.io", "resourceclaims", "get"),  # the pod's claim: its request
    ("resource.k8s.io", "resourceclaims/status", "update"),  # status.allocation, reservedFor
    ("resource.k8s.io", "resourceclaims/binding", "update"),  # 1.36+: those two fields' check
}

#: Never: (group, resource, verb, namespace).
FORBIDDEN = [
    ("", "secrets", "get", NAMESPACE),
    ("", "secrets", "list", ""),
    ("", "nodes", "delete", ""),
    ("", "nodes", "patch", ""),
    ("", "pods", "delete", ""),
    ("", "pods", "create", ""),
    ("", "pods", "get", NAMESPACE),
    ("", "namespaces", "create", ""),
    ("resource.k8s.io", "resourceclaims", "update", ""),
    ("resource.k8s.io", "resourceclaims", "delete", ""),
    ("resource.k8s.io", "resourceslices", "delete", ""),
    ("resource.k8s.io", "resourceclaims/driver", "arbitrary-node:update", ""),
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:update", ""),
    ("", "users", "impersonate", ""),
    ("", "serviceaccounts", "impersonate", ""),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate", ""),
    ("rbac.authorization.k8s.io", "clusterroles", "bind", ""),
]

#: Subresources checked by authorization that discovery does not list.
SYNTHETIC = [
    ("resource.k8s.io", "resourceclaims/binding"),
    ("resource.k8s.io", "resourceclaims/driver"),
]


def _allowed(
    client: KubeClient, account: str, group: str, resource: str, verb: str, namespace: str = ""
) -> bool:
    """The API server's answer for ``account`` in gpupool's namespace (a SubjectAccessReview)."""
    plural, _, sub = resource.partition("/")
    attributes: dict[str, Any] = {"group": group, "resource": plural, "verb": verb}
    if sub:
        attributes["subresource"] = sub
    if namespace:
        attributes["namespace"] = namespace
    review = client.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{NAMESPACE}:{account}",
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{NAMESPACE}",
                    "system:authenticated",
                ],
                "resourceAttributes": attributes,
            },
        },
    )
    return bool(review["status"].get("allowed"))


def _discovered(client: KubeClient) -> list[tuple[str, str]]:
    """(group, resource) for every resource and subresource the API server serves."""
    versions = [("", f"/api/{v}") for v in client.get("/api")["versions"]]
    for group in client.get("/apis")["groups"]:
        for v in group["versions"]:
            versions.append((group["name"], f"/apis/{v['groupVersion']}"))
    found = set(SYNTHETIC)
    for group, path in versions:
        for entry in client.get(path).get("resources") or []:
            found.add((group, entry["name"]))
    return sorted(found)


@pytest.fixture(scope="module")
def rbac_applied(control_plane: ControlPlane) -> KubeClient:
    client = control_plane.client
    for obj in render(BASE, client):
        if obj["kind"] in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            client.apply(obj, field_manager="gpupool-deploy-test")
    return client


def test_the_bridge_account_may_make_every_call_of_the_bridge(rbac_applied: KubeClient) -> None:
    denied = [
        (group, resource, verb, ns)
        for group, resource, verb in sorted(BRIDGE_CALLS)
        for ns in ("", NAMESPACE, f"t-{uuid.uuid4().hex[:6]}")
        if not _allowed(rbac_applied, ACCOUNT, group, resource, verb, ns)
    ]
    assert not denied, f"the bridge's ClusterRole lacks {denied}"


def test_the_bridge_account_may_do_nothing_more(rbac_applied: KubeClient) -> None:
    client = rbac_applied
    nobody = f"nobody-{uuid.uuid4().hex[:6]}"  # an account of no role: what every account has
    resources = _discovered(client)
    assert ("", "pods/binding") in resources
    assert ("resource.k8s.io", "resourceslices") in resources
    extra = []
    for group, resource in resources:
        for verb in VERBS:
            if (group, resource, verb) in BRIDGE_CALLS:
                continue
            if _allowed(client, ACCOUNT, group, resource, verb) and not _allowed(
                client, nobody, group, resource, verb
            ):
                extra.append(f"{verb} {resource}" + (f".{group}" if group else ""))
    assert not extra, f"the bridge's account may do more than the bridge calls: {extra}"
    allowed = [f for f in FORBIDDEN if _allowed(client, ACCOUNT, *f)]
    assert not allowed, f"the bridge's account may {allowed}"


def _account_kubeconfig(client: KubeClient, folder: Path) -> Path:
    """A kubeconfig with a fresh token of the bridge's account and nothing else."""
    answer = client.create(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    path = folder / "bridge.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {
                    "server": client.config.server,
                    "certificate-authority": str(client.config.ca_file),
                },
            }
        ],
        "users": [{"name": ACCOUNT, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": ACCOUNT}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    path.chmod(0o600)
    return path


def test_the_bridge_runs_with_its_account_alone(
    rbac_applied: KubeClient, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    client = rbac_applied
    brains = Brains(control_plane, tmp_path, kubeconfig=_account_kubeconfig(client, tmp_path))
    try:
        node = brains.gpu_node()  # lists Nodes and ResourceSlices, registers the node
        create_pods(control_plane, namespace, gpupool_pod("train", namespace, node))
        job = job_of(control_plane, namespace, "train")  # lists and annotates pods
        assert (
            wait_running(
                control_plane, namespace, "train", "train runs", logs={"bridge": brains.log}
            )
            == node
        )
        claim = pod_claim(client, namespace, "train")
        assert claim is not None
        assert claim["status"]["allocation"]["devices"]["results"]  # the claim's status
        assert claim["status"]["reservedFor"][0]["name"] == "train"
        brains.pool.post(f"/v1/jobs/{job}/cancel", {"reason": "deploy test"})

        def evicted() -> bool:
            pods = client.list(f"/api/v1/namespaces/{namespace}/pods")
            return not any(
                p["metadata"]["name"] == "train" and not p["metadata"].get("deletionTimestamp")
                for p in pods
            )

        wait_for(evicted, "train evicted once gpupool cancels its job")
        wait_for(lambda: brains.job(job)["state"] == "CANCELLED", f"job {job} CANCELLED")
    finally:
        brains.close()
    log = brains.log.read_text()
    assert "forbidden" not in log.lower(), log[-3000:]
