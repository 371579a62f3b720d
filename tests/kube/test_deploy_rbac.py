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
  its devices' status, impersonate, bind roles) are denied, in its own namespace too.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from gpupool.kube.client import KubeClient
from tests.kube.cluster import ControlPlane
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
