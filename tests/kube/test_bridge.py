"""gpupool's brains for pods: pods with ``schedulerName: gpupool`` scheduled by gpupool's server.

The real control plane (``cluster.py``), a real ``gpupool server`` (``tests/e2e/pool.py``) and
the bridge as its own process (``python -m gpupool.kube bridge``), along the user's path: pods
and ResourceClaimTemplates created through the Kubernetes API, quotas and usage through
gpupool's API and CLI. Each test has its own kwok node with one simulated A10 (22.5 GiB, so two
``half-gpu-10gib`` claims fit), its slice published by gpupool's publisher, and keeps its pods
on it with the ``kubernetes.io/hostname`` node selector (the session's cluster holds other
tests' nodes, which the bridge registers too).
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.kube.claims import quantity
from gpupool.kube.podjobs import ANNOTATION_JOB, ANNOTATION_PREEMPTIBLE
from gpupool.kube.slices import DRIVER
from tests.e2e.pool import PY
from tests.kube.brains import Brains
from tests.kube.cluster import ControlPlane
from tests.kube.diagnose import wait_running
from tests.kube.objects import condition, example, pod, pod_claim, wait_for

pytestmark = pytest.mark.timeout(900)

TEMPLATE = "half-gpu-10gib"


@pytest.fixture(scope="module")
def brains(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Brains]:
    b = Brains(control_plane, tmp_path_factory.mktemp("brains"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.client.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    control_plane.client.delete(f"/api/v1/namespaces/{name}")


def gpupool_pod(name: str, namespace: str, node: str, **spec: Any) -> dict[str, Any]:
    """A pod for gpupool's scheduler: one container holding one ``half-gpu-10gib`` claim."""
    annotations = spec.pop("annotations", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "schedulerName": "gpupool",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda-app:1",
                    "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": "100m"}},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
            **spec,
        },
    }


def create_pods(plane: ControlPlane, namespace: str, *pods: dict[str, Any]) -> None:
    client = plane.client
    templates = client.path_for("resource.k8s.io/v1", "ResourceClaimTemplate", namespace)
    if client.get_or_none(f"{templates}/{TEMPLATE}") is None:
        client.create(templates, example(f"{TEMPLATE}.yaml", namespace))
    for p in pods:
        client.create(f"/api/v1/namespaces/{namespace}/pods", p)


def job_of(plane: ControlPlane, namespace: str, name: str) -> str:
    def annotated() -> str | None:
        annotations = pod(plane.client, namespace, name)["metadata"].get("annotations") or {}
        return annotations.get(ANNOTATION_JOB)

    return wait_for(annotated, f"pod {name} submitted to gpupool")


def runs(brains: Brains, plane: ControlPlane, namespace: str, name: str) -> str:
    """The pod's node once it runs; on timeout, why not (with the bridge's log lines on it)."""
    return wait_running(
        plane, namespace, name, f"{namespace}/{name} runs", logs={"bridge": brains.log}
    )


def gpupool_reason(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    c = condition(pod(plane.client, namespace, name), "PodScheduled")
    if c and c.get("status") == "False" and "gpupool:" in str(c.get("message")):
        return c
    return None


def test_pods_of_two_namespaces_run_as_gpupool_jobs_and_usage_is_per_namespace(
    brains: Brains, control_plane: ControlPlane, namespace: str, other_namespace: str
) -> None:
    client = control_plane.client
    node = brains.gpu_node()
    price = brains.pool.http.put(  # type: ignore[union-attr]
        "/v1/pools/default", json={"default_price_per_gpu_hour": 2.5}
    )
    price.raise_for_status()
    for ns in (namespace, other_namespace):
        create_pods(control_plane, ns, gpupool_pod("train", ns, node))
    jobs = {}
    for ns in (namespace, other_namespace):
        assert runs(brains, control_plane, ns, "train") == node
        claim = pod_claim(client, ns, "train")
        assert claim is not None
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, node, "gpu-0")
        consumed = result["consumedCapacity"]
        assert (quantity(consumed["compute"]), quantity(consumed["memory"])) == (500, 10 << 30)
        assert claim["status"]["reservedFor"][0]["name"] == "train"
        jobs[ns] = job_of(control_plane, ns, "train")
        job = brains.pool.wait_state(jobs[ns], "RUNNING", timeout=120)
        assert (job["tenant"], job["gpu_milli"]) == (ns, 500), job
        assert job["nodes"] == [node]
    # Both halves share the one GPU, as gpupool placed them.
    assert len({r["device"] for ns in jobs for r in _results(control_plane, ns)}) == 1

    # One pod ends by itself (its container exits 0, as the kubelet reports it), the other
    # is deleted: the first job completes, the second is cancelled; both are accounted.
    client.request(
        "PATCH", f"/api/v1/namespaces/{namespace}/pods/train/status",
        body={"status": {"phase": "Succeeded", "containerStatuses": [{
            "name": "main", "image": "registry.invalid/cuda-app:1", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }]}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    client.delete(f"/api/v1/namespaces/{other_namespace}/pods/train")
    done = brains.pool.wait_state(jobs[namespace], "COMPLETED", "CANCELLED", timeout=120)
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0), done
    gone = brains.pool.wait_state(jobs[other_namespace], "COMPLETED", "CANCELLED", timeout=120)
    assert gone["state"] == "CANCELLED", gone

    report = subprocess.run(
        [PY, "-m", "gpupool.cli", "report", "--by", "tenant", "--format", "json",
         "--server", brains.pool.url, "--token", brains.token],
        env=brains.pool._env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = {line["key"]["tenant"]: line for line in json.loads(report.stdout)["lines"]}
    for ns in (namespace, other_namespace):
        assert lines[ns]["jobs"] == 1, lines
        assert lines[ns]["gpu_hours"] > 0, lines
        assert lines[ns]["cost"] == pytest.approx(2.5 * lines[ns]["gpu_hours"], rel=0.01), lines


def _results(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    claim = pod_claim(plane.client, namespace, "train")
    assert claim is not None
    return list(claim["status"]["allocation"]["devices"]["results"])


def test_a_namespace_over_its_quota_waits_with_gpupools_reason_on_the_pod(
    brains: Brains, control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    node = brains.gpu_node()
    brains.pool.http.put(f"/v1/tenants/{namespace}", json={}).raise_for_status()  # type: ignore[union-attr]
    brains.pool.http.put(  # type: ignore[union-attr]
        f"/v1/tenants/{namespace}/quotas/default",
        json={"guaranteed_milli": 500, "limit_milli": 500},
    ).raise_for_status()
    create_pods(control_plane, namespace, gpupool_pod("a", namespace, node))
    assert runs(brains, control_plane, namespace, "a") == node
    # The GPU has room for a second half; the namespace's quota has not.
    create_pods(control_plane, namespace, gpupool_pod("b", namespace, node))

    def quota_reason() -> dict[str, Any] | None:
        c = gpupool_reason(control_plane, namespace, "b")
        return c if c and "QuotaExceeded" in c["message"] else None

    reason = wait_for(quota_reason, "b's quota reason on the pod")
    assert reason["reason"] == "Unschedulable"
    assert f"tenant {namespace} in pool default" in reason["message"], reason
    b = pod(client, namespace, "b")
    assert b["status"]["phase"] == "Pending"
    assert not b["spec"].get("nodeName")
    job = brains.job(job_of(control_plane, namespace, "b"))
    assert job["state"] == "PENDING", job
    assert job["pending_reason"] in reason["message"], job
    events = client.list(
        f"/api/v1/namespaces/{namespace}/events", field_selector="involvedObject.name=b"
    )
    assert any(e["reason"] == "GpupoolPending" for e in events), events

    client.delete(f"/api/v1/namespaces/{namespace}/pods/a")
    assert runs(brains, control_plane, namespace, "b") == node


def test_a_pod_gpupool_cannot_take_is_told_why_and_taken_once_fixed(
    brains: Brains, control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    node = brains.gpu_node()
    orphan = gpupool_pod("orphan", namespace, node)
    orphan["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "later"}]
    create_pods(control_plane, namespace, orphan, gpupool_pod("fine", namespace, node))
    assert runs(brains, control_plane, namespace, "fine") == node

    def refused() -> dict[str, Any] | None:
        c = condition(pod(client, namespace, "orphan"), "PodScheduled")
        return c if c and "does not exist" in str(c.get("message")) else None

    reason = wait_for(refused, "the orphan's reason")
    assert f"ResourceClaim {namespace}/later does not exist" in reason["message"], reason
    events = client.list(
        f"/api/v1/namespaces/{namespace}/events", field_selector="involvedObject.name=orphan"
    )
    assert any(e["reason"] == "GpupoolRefused" for e in events), events

    template = example(f"{TEMPLATE}.yaml", namespace)
    claims = client.path_for("resource.k8s.io/v1", "ResourceClaim", namespace)
    client.create(claims, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": "later", "namespace": namespace},
                           "spec": template["spec"]["spec"]})  # fmt: skip
    assert runs(brains, control_plane, namespace, "orphan") == node


class PodWatch:
    """Every change to the pods of a namespace, from a real watch, in order."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        config = plane.client.config
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._http = httpx.Client(base_url=config.server, verify=config.ssl_context(), timeout=None)
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._http.stream("GET", self._path, params={"watch": "true"}) as answer:
                for line in answer.iter_lines():
                    if line:
                        event = json.loads(line)
                        self.seen.append((event["type"], event["object"]))
        except httpx.HTTPError:
            return

    def close(self) -> None:
        self._http.close()


def test_a_higher_priority_pod_preempts_a_lower_one_evicted_with_its_grace(
    brains: Brains, control_plane: ControlPlane, namespace: str
) -> None:
    client = control_plane.client
    for name, value in (("low", 100), ("high", 900)):  # gpupool's classes of the same names
        client.apply(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name}, "value": value},
            field_manager="gpupool-tests",
        )  # fmt: skip
    node = brains.gpu_node()
    low = {"priorityClassName": "low", "terminationGracePeriodSeconds": 17,
           "annotations": {ANNOTATION_PREEMPTIBLE: "true"}}  # fmt: skip
    create_pods(control_plane, namespace, *(gpupool_pod(n, namespace, node, **low)
                                            for n in ("low1", "low2")))  # fmt: skip
    for name in ("low1", "low2"):
        assert runs(brains, control_plane, namespace, name) == node
    lows = {n: job_of(control_plane, namespace, n) for n in ("low1", "low2")}
    watch = PodWatch(control_plane, namespace)
    try:
        # the watch is live once it listed the two pods there are (ADDED, before any change)
        wait_for(lambda: sum(k == "ADDED" for k, _ in list(watch.seen)) >= 2, "the pod watch")
        create_pods(control_plane, namespace,
                    gpupool_pod("high", namespace, node, priorityClassName="high"))  # fmt: skip
        assert runs(brains, control_plane, namespace, "high") == node
        high = job_of(control_plane, namespace, "high")
        assert brains.job(high)["priority_class"] == "high"
        # The first change that marks a pod deleted carries the eviction's grace (kwok, with
        # no kubelet to wait for, then deletes it at once, with grace 0).
        evicted: dict[str, int] = {}
        for kind, obj in list(watch.seen):
            if kind == "MODIFIED" and obj["metadata"].get("deletionTimestamp"):
                grace = obj["metadata"].get("deletionGracePeriodSeconds")
                evicted.setdefault(obj["metadata"]["name"], grace)
    finally:
        watch.close()
    assert len(evicted) == 1, evicted
    (victim, grace) = next(iter(evicted.items()))
    assert victim in lows
    assert grace == 17, evicted
    victim_job = brains.pool.wait_state(lows[victim], "PREEMPTED", timeout=120)
    assert victim_job["priority_class"] == "low"
    events = brains.pool.get(f"/v1/jobs/{lows[victim]}/events")
    assert any(f"preempted for job {high}" in str(e) for e in events), events
    survivor = next(n for n in lows if n != victim)
    assert brains.job(lows[survivor])["state"] == "RUNNING"


def test_a_killed_bridge_restarts_from_the_pods_and_carries_on(
    brains: Brains, control_plane: ControlPlane, namespace: str
) -> None:
    """The bridge keeps no state of its own: job and assignment ids are the pods'
    annotations, and the nodes' agent ids derive from their names."""
    client = control_plane.client
    node = brains.gpu_node()
    create_pods(control_plane, namespace, gpupool_pod("before", namespace, node))
    assert runs(brains, control_plane, namespace, "before") == node
    before = job_of(control_plane, namespace, "before")
    brains.pool.wait_state(before, "RUNNING", timeout=120)

    brains.restart_bridge()
    create_pods(control_plane, namespace, gpupool_pod("after", namespace, node))
    assert runs(brains, control_plane, namespace, "after") == node
    after = brains.pool.wait_state(
        job_of(control_plane, namespace, "after"), "RUNNING", timeout=120
    )
    assert brains.job(before)["state"] == "RUNNING"  # not lost nor started twice
    assert after["nodes"] == [node]
    client.delete(f"/api/v1/namespaces/{namespace}/pods/before")
    assert brains.pool.wait_state(before, "CANCELLED", "COMPLETED", timeout=120)["state"] == (
        "CANCELLED"
    )


def test_a_namespace_reclaims_its_guarantee_from_a_borrowing_one(
    brains: Brains, control_plane: ControlPlane, namespace: str, other_namespace: str
) -> None:
    """Same priority: the quota decides. ``namespace`` has no guarantee and borrows the idle
    GPU with preemptible pods; ``other_namespace`` is guaranteed the GPU and takes back half."""
    client = control_plane.client
    node = brains.gpu_node()
    http = brains.pool.http
    assert http is not None
    for ns, guaranteed in ((namespace, 0), (other_namespace, 1000)):
        http.put(f"/v1/tenants/{ns}", json={}).raise_for_status()
        quota = {"guaranteed_milli": guaranteed, "limit_milli": 1000}
        http.put(f"/v1/tenants/{ns}/quotas/default", json=quota).raise_for_status()
    borrow = {"terminationGracePeriodSeconds": 9, "annotations": {ANNOTATION_PREEMPTIBLE: "true"}}
    create_pods(control_plane, namespace,
                *(gpupool_pod(n, namespace, node, **borrow) for n in ("b1", "b2")))  # fmt: skip
    borrowers = {}
    for name in ("b1", "b2"):
        assert runs(brains, control_plane, namespace, name) == node
        borrowers[name] = job_of(control_plane, namespace, name)
    create_pods(control_plane, other_namespace, gpupool_pod("owner", other_namespace, node))
    assert runs(brains, control_plane, other_namespace, "owner") == node
    owner = job_of(control_plane, other_namespace, "owner")

    def preempted() -> list[str]:
        return [n for n, j in borrowers.items() if brains.job(j)["state"] == "PREEMPTED"]

    (victim,) = wait_for(preempted, "one borrower preempted")
    events = brains.pool.get(f"/v1/jobs/{borrowers[victim]}/events")
    assert any(f"preempted for job {owner}" in str(e) for e in events), events
    assert pod(client, namespace, next(n for n in borrowers if n != victim))["spec"]["nodeName"]
