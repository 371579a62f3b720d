"""Compute in whole milli-GPU, end to end: how a claim spells it, what the scheduler charges.

gpupool publishes each GPU's ``compute`` as ``1000`` (milli-GPU, steps of 10). A claim asks
``compute: "250"`` for a quarter of a GPU; the real kube-scheduler charges exactly that (the
allocation's ``consumedCapacity``), and four such pods fill one GPU's compute: of five racing
for one GPU, any four run and the fifth waits (Kubernetes promises no order). The quantity
spellings of a fraction (``250m``, ``0.25``) would be read as a quarter of one milli-GPU and
rounded up to the smallest share without a word; ``1`` meaning one GPU would get 1 %. The
base's ``claimpolicy.yaml`` (a ValidatingAdmissionPolicy) refuses them at the API server, for
ResourceClaimTemplates and ResourceClaims alike, saying how to write it; nothing is stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.client import KubeClient, KubeError
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import device_class
from tests.kube.cluster import ControlPlane
from tests.kube.diagnose import pod_report, pods_report
from tests.kube.objects import (
    REPO_ROOT,
    claim_pod,
    condition,
    pod,
    pod_claim,
    running_on,
    wait_for,
)

POLICY = REPO_ROOT / "deploy" / "kubernetes" / "claimpolicy.yaml"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims"

#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def _claim_spec(compute: object) -> dict[str, Any]:
    request = {
        "deviceClassName": "gpu.gpupool.io",
        "capacity": {"requests": {"compute": compute, "memory": "1Gi"}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}


def _template(name: str, namespace: str, compute: object) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": _claim_spec(compute)},
    }


def _refusal(client: KubeClient, path: str, body: dict[str, Any]) -> KubeError | None:
    try:
        client.create(path, body)
    except KubeError as exc:
        return exc
    return None


@pytest.fixture
def policy(control_plane: ControlPlane) -> Iterator[None]:
    """The base's compute policy in force for one test, withdrawn after it (it is cluster-wide:
    other tests of the session apply the base themselves when they want it)."""
    client = control_plane.client
    docs = list(yaml.safe_load_all(POLICY.read_text()))
    _apply_policy(client, docs)
    yield
    for doc in reversed(docs):
        resource = client.resource(doc["apiVersion"], doc["kind"])
        client.delete(resource.path(None, doc["metadata"]["name"]))


def _apply_policy(client: KubeClient, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        client.apply(doc, field_manager="gpupool-tests")
    # The API server type-checks the policy's CEL against ResourceClaim(Template)s: no warnings.
    path = client.path_for("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
    name = "gpu.gpupool.io-compute-in-milli-gpu"

    def checked() -> dict[str, Any] | None:
        status = client.get(f"{path}/{name}").get("status") or {}
        return status if status.get("observedGeneration") else None

    status = wait_for(checked, "the policy type-checked")
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


@pytest.mark.usefixtures("policy")
def test_compute_in_fractions_of_a_gpu_is_refused_with_how_to_write_it(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    templates = TEMPLATES.format(namespace)

    # The policy takes effect once the API server has loaded it (an informer): wait on that,
    # with dry runs (a probe accepted before then is not stored).
    def refused() -> KubeError | None:
        return _refusal(client, f"{templates}?dryRun=All", _template("probe", namespace, "500m"))

    error = wait_for(refused, "the compute policy in force")
    assert error.status == 422, error
    assert "counted in milli-GPU" in error.message, error.message
    assert 'compute: "500" for half a GPU' in error.message, error.message
    assert "500m" in error.message, error.message

    for compute in ("0.5", "1", "2000", "250m"):
        refusal = _refusal(client, templates, _template("bad", namespace, compute))
        assert refusal is not None, f"compute {compute!r} was accepted"
        assert refusal.status == 422, refusal
        assert "milli-GPU" in refusal.message, refusal
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "direct", "namespace": namespace},
        "spec": _claim_spec("0.25"),
    }
    refusal = _refusal(client, CLAIMS.format(namespace), claim)
    assert refusal is not None
    assert "milli-GPU" in refusal.message, refusal
    # Bad input changes nothing.
    assert client.list(templates) == []
    assert client.list(CLAIMS.format(namespace)) == []

    # Other classes' claims are not the policy's business.
    other = _template("other", namespace, "500m")
    other["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other"
    assert _refusal(client, templates, other) is None


@pytest.mark.usefixtures("policy")
def test_quarter_gpus_spelled_in_milli_gpu_are_charged_exactly_by_the_kube_scheduler(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    client.apply(device_class(), field_manager="gpupool-tests")
    node = f"kwok-{uuid.uuid4().hex[:8]}"
    control_plane.add_kwok_node(node)
    SlicePublisher(client, SimulatedBackend.from_spec("1xA100-80GB", node=node), node).sync()
    templates = TEMPLATES.format(namespace)
    # The same share written as a string and as a YAML number: both are 250 milli-GPU.
    client.create(templates, _template("quarter", namespace, "250"))
    client.create(templates, _template("quarter-number", namespace, 250))
    pods = f"/api/v1/namespaces/{namespace}/pods"
    names = [f"q{i}" for i in range(5)]
    for i, name in enumerate(names):
        template = "quarter" if i % 2 == 0 else "quarter-number"
        client.create(pods, claim_pod(name, namespace, template, node))

    # Five quarters race for one GPU: any four of them get it. Which four is not the test's to
    # say: a pod reaches the scheduler once the controller manager has made its claim, and its
    # concurrent workers make a backlog of claims in any order (a loaded machine: q4 placed
    # before q3, which then waited for ever). Any four hold both spellings (q0, q2, q4 the
    # string; q1, q3 the number).
    def four_running() -> list[str] | None:
        running = [n for n in names if running_on(client, namespace, n)]
        return running if len(running) >= 4 else None

    running = wait_for(
        four_running, "four of the five quarters running",
        explain=lambda: pods_report(control_plane, namespace, names),
    )  # fmt: skip
    assert len(running) == 4, f"five quarters on one GPU: {running}"
    for name in running:
        assert running_on(client, namespace, name) == node
        claim = pod_claim(client, namespace, name)
        assert claim is not None
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0"
        assert result["consumedCapacity"]["compute"] == "250", result

    # Four quarters fill the GPU's 1000: the fifth waits with the scheduler's reason.
    (fifth,) = set(names) - set(running)

    def unschedulable() -> dict[str, Any] | None:
        c = condition(pod(client, namespace, fifth), "PodScheduled")
        if c and c.get("reason") == "Unschedulable" and "cannot allocate" in c.get("message", ""):
            return c
        return None

    reason = wait_for(
        unschedulable, f"the fifth quarter ({fifth}) reported unschedulable for its claim",
        explain=lambda: pod_report(control_plane, namespace, fifth),
    )  # fmt: skip
    assert "cannot allocate all claims" in reason["message"], reason
    waiting = pod(client, namespace, fifth)
    assert waiting["status"]["phase"] == "Pending"
    assert not waiting["spec"].get("nodeName"), waiting["spec"]
    claim = pod_claim(client, namespace, fifth)
    assert claim is not None
    assert not (claim.get("status") or {}).get("allocation"), claim["status"]
