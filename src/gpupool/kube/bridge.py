"""gpupool's scheduler for pods: ``python -m gpupool.kube bridge`` (a Deployment beside the server).

Pods that set ``schedulerName: gpupool`` are left alone by the kube-scheduler. The bridge turns
each into a gpupool job through the server's ordinary API (the namespace is the tenant, the
claim's share the request; :mod:`gpupool.kube.podjobs`), so gpupool's own scheduler decides:
quotas and borrowing, priority and preemption, fair share, the fragmentation-aware packing and
the reasons a job waits. The Kubernetes nodes gpupool's DRA driver published are gpupool nodes
whose agent is the bridge (:mod:`gpupool.kube.podnodes`), and the bridge carries out what the
server orders there:

- **start** (a replica placed on devices): the pod's ResourceClaim gets the allocation the
  kube-scheduler would have written (device results with consumed capacity, share IDs, the
  node selector, the pod in ``reservedFor``), the pod is annotated with the assignment and
  bound to the node (``pods/binding``); the kubelet then prepares the claim through gpupool's
  kubelet plugin as for any claim. Reported ``running``.
- **stop** (preemption, cancel, time limit): the pod is evicted (``pods/eviction``) with the
  order's grace, which is the pod's ``terminationGracePeriodSeconds`` (the checkpoint signal
  is the SIGTERM the kubelet sends); once the pod is gone, reported ``exited`` with the reason.
- A pod that **ends** (``Succeeded``/``Failed``) or is **deleted** ends its job (a deleted
  pod's job is cancelled), so usage and cost are recorded per namespace.
- While a job **pends**, its reason is mirrored on the pod: ``PodScheduled=False``,
  ``reason: Unschedulable``, ``message: gpupool: <reason>``, and an Event when it changes.

The bridge keeps no state of its own: a pod carries its job id and assignment id in
annotations, and each cycle starts from the API server's lists, so a restarted bridge carries
on. Submits use the pod's UID as the idempotency key, so a retried submit makes no second job.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpupool.client.errors import ApiError
from gpupool.client.sdk import Client
from gpupool.domain.errors import GpupoolError
from gpupool.kube.client import KubeClient, KubeError
from gpupool.kube.podjobs import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_JOB,
    NO_CLAIM,
    REASON_PENDING,
    REASON_REFUSED,
    SCHEDULER_NAME,
    DeviceShare,
    PodRef,
    PodRefused,
    allocation_status,
    binding,
    job_spec,
    pending_condition,
    pod_claim_name,
    pod_of_command,
)
from gpupool.kube.podnodes import AgentCallError, PodNodes
from gpupool.schemas.agent import AssignmentSpec, ReplicaState, ReplicaStatus, StopOrder
from gpupool.schemas.agent import StopReason as WireStop

log = logging.getLogger(__name__)

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
#: At most this many pods submitted, and pending reasons written, per cycle: a burst of new
#: pods is taken over a few cycles while every node keeps its heartbeat (the server marks a
#: node down after its node timeout without one).
BATCH = 50


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Replica:
    """A bound pod the bridge reports for its node."""

    assignment_id: str
    node: str
    pod: PodRef
    stop: WireStop | None = None  # the server's stop order carried out
    evicted: bool = False
    boot_failed: str | None = None  # why Kubernetes refused the placement (for good)


class Bridge:
    """One bridge: a gpupool client (an admin or operator token: submits to any tenant, cancels,
    makes tenants), the agent side (:class:`PodNodes`) and the Kubernetes client."""

    def __init__(self, kube: KubeClient, gpupool: Client, nodes: PodNodes) -> None:
        self.kube = kube
        self.gpupool = gpupool
        self.nodes = nodes
        self.replicas: dict[str, Replica] = {}
        self._mirrored: dict[str, str] = {}  # pod uid -> the message last written on it
        self._tenants: set[str] = set()
        self._classes: frozenset[str] = frozenset()
        self._classes_at = 0.0

    # -- one cycle ---------------------------------------------------------------------------

    def cycle(self) -> None:
        """Nodes, new pods, heartbeats (orders carried out), pending reasons: once each."""
        self.nodes.refresh()
        pods = {
            p["metadata"]["uid"]: p
            for p in self.kube.list(
                "/api/v1/pods", field_selector=f"spec.schedulerName={SCHEDULER_NAME}"
            )
        }
        self._adopt(pods)
        new = [
            p for p in pods.values()
            if not self._job_of(p) and not p["spec"].get("nodeName") and not _deleting(p)
        ]  # fmt: skip
        for pod in new[:BATCH]:  # the rest next cycle: heartbeats never wait long
            self._submit(pod)
        for node in list(self.nodes.nodes):
            self._heartbeat(node, pods)
        self._pending(pods)

    def run(self, stop: threading.Event, *, interval_s: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.cycle()
            except (GpupoolError, KubeError) as exc:
                log.warning("bridge cycle: %s", exc)
            stop.wait(interval_s)

    # -- pods -> jobs ------------------------------------------------------------------------

    @staticmethod
    def _job_of(pod: Mapping[str, Any]) -> str | None:
        return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_JOB)

    def _adopt(self, pods: Mapping[str, dict[str, Any]]) -> None:
        """Bound pods with an assignment the bridge does not track yet (after a restart)."""
        known = {r.pod.uid for r in self.replicas.values()}
        for uid, pod in pods.items():
            annotations = pod["metadata"].get("annotations") or {}
            node = pod["spec"].get("nodeName")
            if uid not in known and node and ANNOTATION_ASSIGNMENT in annotations:
                aid = annotations[ANNOTATION_ASSIGNMENT]
                self.replicas[aid] = Replica(aid, node, PodRef.of(pod))

    def _priority_classes(self) -> frozenset[str]:
        if time.monotonic() - self._classes_at > 30:
            self._classes = frozenset(c.name for c in self.gpupool.priority_classes())
            self._classes_at = time.monotonic()
        return self._classes

    def _ensure_tenant(self, namespace: str) -> None:
        if namespace in self._tenants:
            return
        try:
            self.gpupool.tenant(namespace)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.gpupool.put_tenant(namespace, display_name=f"Kubernetes namespace {namespace}")
            log.info("made tenant %s for its namespace", namespace)
        self._tenants.add(namespace)

    def _submit(self, pod: dict[str, Any]) -> None:
        ref = PodRef.of(pod)
        try:
            claim_name = pod_claim_name(pod)
            if claim_name is None:
                return  # the controller manager has not made the claim from its template yet
            claim = (
                None
                if claim_name == NO_CLAIM
                else self.kube.get_or_none(CLAIMS.format(ns=ref.namespace) + f"/{claim_name}")
            )
            if claim_name and claim is None:
                raise PodRefused(
                    f"its ResourceClaim {ref.namespace}/{claim_name} does not exist: create it "
                    "(the pod is taken once it does)"
                )
            spec = job_spec(pod, claim, pool=self.nodes.pool,
                            priority_classes=self._priority_classes())  # fmt: skip
            self._ensure_tenant(ref.namespace)
            answer = self.gpupool.request(
                "POST", "/v1/jobs",
                json={"spec": spec, "idempotency_key": f"kube-pod-{ref.uid}", "queue_anyway": True},
            ).json()  # fmt: skip
        except (PodRefused, ApiError) as exc:
            self._mirror(pod, REASON_REFUSED, f"gpupool cannot schedule this pod: {exc}")
            return
        job_id = str(answer["job"]["id"])
        self._annotate(ref, {ANNOTATION_JOB: job_id})
        pod["metadata"].setdefault("annotations", {})[ANNOTATION_JOB] = job_id
        log.info("pod %s is gpupool job %s", ref, job_id)

    def _annotate(self, ref: PodRef, annotations: dict[str, str]) -> None:
        self.kube.request(
            "PATCH", f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}",
            body={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
        )  # fmt: skip

    # -- the node's agent --------------------------------------------------------------------

    def _report(self, r: Replica, pods: Mapping[str, dict[str, Any]]) -> ReplicaStatus:
        if r.boot_failed is not None:
            return ReplicaStatus(assignment_id=r.assignment_id, state=ReplicaState.BOOT_FAILED,
                                 reason=r.boot_failed[:2000], final=True)  # fmt: skip
        pod = pods.get(r.pod.uid)
        if pod is None or pod["spec"].get("nodeName") != r.node:
            if r.stop is None:  # deleted by someone else: the job is cancelled
                r.stop = WireStop.CANCEL
                self._cancel(r.pod, "its pod was deleted")
            return ReplicaStatus(assignment_id=r.assignment_id, state=ReplicaState.EXITED,
                                 signal="SIGTERM", stop_reason=r.stop)  # fmt: skip
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            code = 0 if phase == "Succeeded" else _exit_code(pod)
            return ReplicaStatus(assignment_id=r.assignment_id, state=ReplicaState.EXITED,
                                 exit_code=code, stop_reason=r.stop)  # fmt: skip
        return ReplicaStatus(
            assignment_id=r.assignment_id, state=ReplicaState.RUNNING, isolation="shim"
        )

    def _heartbeat(self, node: str, pods: Mapping[str, dict[str, Any]]) -> None:
        mine = [r for r in self.replicas.values() if r.node == node]
        try:
            answer = self.nodes.heartbeat(node, [self._report(r, pods) for r in mine])
        except AgentCallError as exc:
            log.warning("%s", exc)
            return
        for aid in answer.finished_ack:
            self.replicas.pop(aid, None)
        by_job = {self._job_of(p): p for p in pods.values() if self._job_of(p)}
        for order in answer.start:
            if order.assignment_id not in self.replicas:
                self._start(node, order, by_job.get(order.job_id), pods)
        for stop in answer.stop:
            self._stop(stop, pods)

    def _start(
        self, node: str, order: AssignmentSpec, pod: dict[str, Any] | None,
        pods: Mapping[str, dict[str, Any]],
    ) -> None:  # fmt: skip
        if pod is None:  # not annotated yet in this cycle's list: the job names its pod
            ref = pod_of_command(self.gpupool.get(order.job_id).command)
            pod = pods.get(ref.uid) if ref is not None else None
        if pod is None or _deleting(pod):
            ref = pod_of_command(self.gpupool.get(order.job_id).command)
            self.replicas[order.assignment_id] = Replica(
                order.assignment_id, node, ref or PodRef("", "", ""), stop=WireStop.CANCEL
            )
            if ref is not None:
                self._cancel(ref, "its pod is gone")
            return
        ref = PodRef.of(pod)
        names = self.nodes.nodes[node].names
        shares = [
            DeviceShare(names[u], order.milli_per_device, order.memory_mib_per_device)
            for u in order.device_uuids
        ]
        try:
            if pod["spec"].get("nodeName") != node:  # bound already: a retried start
                self._place(pod, ref, node, shares, order.assignment_id)
        except KubeError as exc:
            if exc.status in (0, 409, 429) or exc.status >= 500:
                log.warning("cannot place pod %s yet (retried): %s", ref, exc)
                return  # the server sends the start again until it is reported
            self.replicas[order.assignment_id] = Replica(
                order.assignment_id, node, ref, boot_failed=f"Kubernetes refused: {exc}"
            )
            self._mirror(pod, REASON_REFUSED, f"gpupool could not bind this pod: {exc}")
            return
        self.replicas[order.assignment_id] = Replica(order.assignment_id, node, ref)
        self._mirrored.pop(ref.uid, None)
        log.info("bound pod %s to %s on %s (job %s)", ref, node,
                 ",".join(s.device for s in shares), order.job_id)  # fmt: skip

    def _place(
        self, pod: dict[str, Any], ref: PodRef, node: str, shares: list[DeviceShare], aid: str
    ) -> None:
        """The claim allocated as the kube-scheduler would, then the pod annotated and bound."""
        claim_name = pod_claim_name(pod)
        if claim_name:  # a CPU job (no claim) is only bound
            path = CLAIMS.format(ns=ref.namespace) + f"/{claim_name}"
            claim = self.kube.get(path)
            claim["status"] = allocation_status(
                claim, node, shares, ref, [str(uuid.uuid4()) for _ in shares]
            )
            self.kube.request("PUT", f"{path}/status", body=claim)
        self._annotate(ref, {ANNOTATION_ASSIGNMENT: aid})
        self.kube.create(
            f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/binding", binding(ref, node)
        )

    def _stop(self, order: StopOrder, pods: Mapping[str, dict[str, Any]]) -> None:
        r = self.replicas.get(order.assignment_id)
        if r is None or r.evicted:
            return
        r.stop = WireStop(order.reason)
        r.evicted = True
        if r.pod.uid not in pods:
            return
        grace = int(order.grace_period_s)
        self.kube.create(
            f"/api/v1/namespaces/{r.pod.namespace}/pods/{r.pod.name}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": r.pod.name, "namespace": r.pod.namespace},
                "deleteOptions": {"gracePeriodSeconds": grace},
            },
        )
        self._event(r.pod, "Warning", f"Gpupool{order.reason.value.capitalize()}",
                    f"gpupool stops this pod ({order.reason.value}): evicted with "
                    f"{grace} s of grace after SIGTERM")  # fmt: skip
        log.info("evicted pod %s (%s, grace %d s)", r.pod, order.reason.value, grace)

    def _cancel(self, ref: PodRef, why: str) -> None:
        job = self._job_id_for(ref)
        if job is None:
            return
        try:
            self.gpupool.cancel(job, reason=why)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _job_id_for(self, ref: PodRef) -> str | None:
        for job in self.gpupool.list(tenant=ref.namespace, name=ref.name):
            if pod_of_command(job.command) == ref:
                return job.id
        return None

    # -- pending jobs ------------------------------------------------------------------------

    def _pending(self, pods: Mapping[str, dict[str, Any]]) -> None:
        """Mirrors each pending job's reason onto its pod; cancels jobs whose pod is gone."""
        jobs = self.gpupool.list(state=["PENDING"], pool=self.nodes.pool)
        writes = 0
        for job in jobs:
            ref = pod_of_command(job.command)
            if ref is None:
                continue
            pod = pods.get(ref.uid)
            if pod is None or _deleting(pod):
                self.gpupool.cancel(job.id, reason="its pod was deleted")
                continue
            if job.pending_reason and writes < BATCH:  # None until a cycle judged it
                writes += self._mirror(pod, REASON_PENDING, f"gpupool: {job.pending_reason}")

    def _mirror(self, pod: Mapping[str, Any], event_reason: str, message: str) -> bool:
        """Writes the reason on the pod unless it is there already; ``True`` when written."""
        ref = PodRef.of(pod)
        if self._mirrored.get(ref.uid) == message:
            return False
        condition = pending_condition("Unschedulable", message, _now())
        try:
            self.kube.request(
                "PATCH", f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}/status",
                body={"status": {"conditions": [condition]}},
                content_type="application/strategic-merge-patch+json",
            )  # fmt: skip
            self._event(ref, "Warning" if event_reason == REASON_REFUSED else "Normal",
                        event_reason, message)  # fmt: skip
        except KubeError as exc:
            if exc.status != 404:
                raise
        self._mirrored[ref.uid] = message
        return True

    def _event(self, ref: PodRef, kind: str, reason: str, message: str) -> None:
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": kind,
            "source": {"component": "gpupool-bridge"},
            "reportingComponent": "gpupool-bridge",
            "reportingInstance": "gpupool-bridge",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(f"/api/v1/namespaces/{ref.namespace}/events", event)
        except KubeError as exc:  # an event is for people; the condition is what matters
            log.warning("cannot raise event %s on pod %s: %s", reason, ref, exc)


def _deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _exit_code(pod: Mapping[str, Any]) -> int:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return 1
