"""Why a pod of a kube test is not where the test expected it: the report a failed wait prints.

A wait on a pod that times out says only "not reached". With a real scheduler and controller
manager behind it, the reason is in the cluster: the pod's conditions (the scheduler's own
``PodScheduled`` message), its Events, its ResourceClaim (created by the controller manager
from the template? allocated? reserved for whom?), the other claims on the same node, and the
components' log lines naming the pod. :func:`pod_report` gathers them; :func:`wait_running` is
the wait on a pod running that prints it for every pod of interest when it times out.

Every read here is best effort: a report that fails to gather one part says so in that part
and goes on, so that it never hides the failure it is explaining.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.kube.cluster import ControlPlane
from tests.kube.objects import running_on, wait_for

#: Log lines kept per component and pod (the most recent ones).
LOG_LINES = 12
#: The components whose logs name pods: the scheduler (attempts, reasons, bindings) and the
#: controller manager (claims made from templates, pod status updates).
LOGGED = ("kube-scheduler", "kube-controller-manager")


def _guarded(part: str, read: Callable[[], list[str]]) -> list[str]:
    try:
        return read()
    # Anything: a report never raises over the failure it explains.
    except Exception as exc:
        return [f"  ({part}: cannot read: {exc!r})"]


def _pod_lines(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    p = plane.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    status = p.get("status") or {}
    lines = [
        f"  phase {status.get('phase')!r}, node {p.get('spec', {}).get('nodeName')!r}, "
        f"selector {p.get('spec', {}).get('nodeSelector')!r}"
    ]
    for c in status.get("conditions") or []:
        lines.append(
            f"  condition {c.get('type')}={c.get('status')} {c.get('reason') or ''}: "
            f"{c.get('message') or ''}"
        )
    lines.append(f"  resourceClaimStatuses {status.get('resourceClaimStatuses')!r}")
    return lines


def _event_lines(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    events = plane.client.list(
        f"/api/v1/namespaces/{namespace}/events", field_selector=f"involvedObject.name={name}"
    )
    return [
        f"  event {e.get('type')} {e.get('reason')} x{e.get('count') or 1} "
        f"from {(e.get('source') or {}).get('component') or e.get('reportingComponent')}: "
        f"{e.get('message')}"
        for e in events
    ] or ["  (no events)"]


def _allocation(claim: dict[str, Any]) -> str:
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    shares = [
        f"{r.get('pool')}/{r.get('device')} {r.get('consumedCapacity') or 'whole'}" for r in results
    ]
    owners = [f"{r.get('resource')}/{r.get('name')}" for r in status.get("reservedFor") or []]
    return f"allocated {shares or 'no'}; reserved for {owners or 'nobody'}"


def _claim_lines(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    claims = plane.client.list(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")
    lines = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        owners = [o.get("name") for o in meta.get("ownerReferences") or []]
        mark = "this pod's" if name in owners else f"pod {owners}'s"
        lines.append(f"  claim {meta.get('name')} ({mark}): {_allocation(claim)}")
    return lines or ["  (no claims in the namespace: the controller manager made none yet)"]


def _log_lines(
    plane: ControlPlane, namespace: str, name: str, logs: Mapping[str, Path]
) -> list[str]:
    needle = f"{namespace}/{name}"
    lines = []
    for component, path in {**{c: plane.log(c) for c in LOGGED}, **logs}.items():
        text = path.read_text(errors="replace").splitlines()
        # ``namespace/name`` also finds its claims' lines: they are named ``<pod>-<claim>-...``.
        hits = [line for line in text if needle in line]
        lines.append(f"  {component} log, {len(hits)} lines naming it, the last {LOG_LINES}:")
        lines.extend(f"    {line[:400]}" for line in hits[-LOG_LINES:])
    return lines


def pod_report(
    plane: ControlPlane, namespace: str, name: str, *, logs: Mapping[str, Path] | None = None
) -> str:
    """Everything the cluster says about why pod ``namespace/name`` is where it is; ``logs``:
    more logs that name pods as ``namespace/name`` (the bridge's), by the name to show."""
    lines = [f"pod {namespace}/{name}:"]
    lines += _guarded("the pod", lambda: _pod_lines(plane, namespace, name))
    lines += _guarded("its events", lambda: _event_lines(plane, namespace, name))
    lines += _guarded("the namespace's claims", lambda: _claim_lines(plane, namespace, name))
    lines += _guarded("the logs", lambda: _log_lines(plane, namespace, name, logs or {}))
    return "\n".join(lines)


def pods_report(plane: ControlPlane, namespace: str, names: Iterable[str]) -> str:
    return "\n".join(pod_report(plane, namespace, n) for n in names)


def wait_running(
    plane: ControlPlane,
    namespace: str,
    name: str,
    what: str | None = None,
    *,
    logs: Mapping[str, Path] | None = None,
) -> str:
    """The node of pod ``name`` once kwok reports it Running; on timeout, why it is not."""
    return wait_for(
        lambda: running_on(plane.client, namespace, name),
        what or f"{namespace}/{name} running",
        explain=lambda: pod_report(plane, namespace, name, logs=logs),
    )
