"""Packing of the Alibaba pod list: the real kube-scheduler (DRA, gpupool's slices) against
gpupool's own placement, on the same nodes and the same pods: in the simulator's packing loop
and for real pods through gpupool's bridge (``schedulerName: gpupool``).

The FGD paper's static experiment (``gpupool.sim.packing``), cut to ``--nodes`` GPU nodes of
``openb_node_list_gpu_node.csv`` (drawn with the seed): the pods of ``openb_pod_list_default.csv``
shuffled and inflated to ``--ratio`` (130 %) of those nodes' GPU capacity, each placed once or
dropped, none leaving. GPU memory is not constrained (as in the paper).

- **gpupool**: ``--policy`` (default ``fragaware``) through the simulator's packing loop.
- **kube-scheduler**: the test control plane (``tests/kube/cluster.py``); each node a kwok node
  with the record's CPU and memory, its GPUs one ResourceSlice published the way
  ``gpupool.kube`` does (model attribute from the trace); each pod created in the same order with
  its CPU and memory requests and, for a GPU pod, its own ResourceClaim (``count`` GPUs of
  ``compute`` = the pod's milli-GPU, a model selector for ``gpu_spec``). A pod the scheduler
  cannot place now can never be placed later (nothing leaves), so the end state is compared.
- **gpupool bridge** (``--bridge``): a second control plane with the same kwok nodes and slices,
  a real ``gpupool server`` (its ``default`` pool: ``fragaware``) and ``python -m gpupool.kube
  bridge``; the same pods created in the same order with ``schedulerName: gpupool`` (the model
  constraint as the ``gpupool.io/gpu-types`` annotation, since the bridge does not evaluate CEL;
  CPU-only pods too, as gpupool CPU jobs). Placed = bound by the bridge once every pod is
  submitted, every job runs or pends with the scheduler's reason, and the count of bound pods
  has not moved for ``--settle`` seconds.

Prints allocated GPU milli as % of capacity for each, and the pods each placed.

    .venv/bin/python benchmarks/bench_kube_packing.py --nodes 20 --bridge
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.pool import wait_for
from tests.kube.brains import Brains
from tests.kube.cluster import ControlPlane, find_binaries, kwok_node

from gpupool.domain.units import MILLI_PER_GPU
from gpupool.gpu.base import DeviceInfo
from gpupool.kube.podjobs import ANNOTATION_GPU_TYPES, ANNOTATION_JOB
from gpupool.kube.slices import PublishedGpu, device_class, resource_slice
from gpupool.scheduling.placement.base import PolicyOptions
from gpupool.scheduling.placement.fgd import TraceInformed
from gpupool.scheduling.placement.registry import make_policy
from gpupool.sim.alibaba import NodeRecord, PodRecord, read_nodes, read_pods
from gpupool.sim.packing import build_capacity, pod_shape, tune

DATA = Path(os.environ.get("GPUPOOL_SHARED_DATA", "/work/shared/data")) / "alibaba-gpu-v2023/csv"
NS = "packing"


def gpupool_packing(
    nodes: list[NodeRecord], pods: list[PodRecord], policy_name: str, seed: int
) -> int:
    """Allocated GPU milli with gpupool's ``policy_name``, pods in the given order."""
    capacity = build_capacity(nodes)
    shapes = [pod_shape(p, capacity.model_names) for p in pods]
    policy = make_policy(policy_name, PolicyOptions(seed=seed))
    if isinstance(policy, TraceInformed):
        policy.know_trace(shapes, len(capacity.model_names))
    allocated = placed = 0
    for shape in shapes:
        policy.observe(shape)
        feasible = capacity.feasible_nodes(shape)
        choice = policy.place(capacity, shape, feasible) if feasible.any() else None
        if choice is not None:
            capacity.allocate(shape, choice)
            allocated += shape.total_milli
            placed += 1
    return allocated, placed


def _slice(record: NodeRecord) -> dict[str, Any]:
    number = int(record.name.rsplit("-", 1)[-1])
    gpus = [
        PublishedGpu(
            DeviceInfo(
                uuid=f"GPU-{number:08d}-0000-0000-0000-{i:012d}",
                index=i,
                name=record.model or "unknown",
                memory_mib=1 << 20,  # not constrained in this experiment
            )
        )
        for i in range(record.gpu_count)
    ]
    return resource_slice(record.name, gpus, 1)


def _claim(i: int, pod: PodRecord) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": "gpu.gpupool.io",
        "allocationMode": "ExactCount",
        "count": pod.num_gpu,
        # GPU memory is not constrained here; a request must still name it, or it takes it all.
        "capacity": {"requests": {"compute": str(pod.gpu_milli), "memory": "1Mi"}},
    }
    if pod.gpu_spec:
        models = ", ".join(f'"{m}"' for m in pod.gpu_spec)
        expression = f'device.attributes["gpu.gpupool.io"].model in [{models}]'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _pod(i: int, pod: PodRecord) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "c",
        "image": "registry.invalid/app:1",
        "resources": {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}},
    }
    spec: dict[str, Any] = {"containers": [container]}
    if pod.num_gpu > 0:
        container["resources"]["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c{i}"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": NS},
        "spec": spec,
    }


def _bridge_pod(i: int, pod: PodRecord) -> dict[str, Any]:
    """The pod as gpupool's bridge takes it: its scheduler, the model constraint annotated, a
    claim without selectors; names that sort in creation order (the bridge submits in list
    order, which is by name)."""
    body = _pod(i, pod)
    body["metadata"]["name"] = f"p{i:06d}"
    body["spec"]["schedulerName"] = "gpupool"
    if pod.gpu_spec:
        body["metadata"]["annotations"] = {ANNOTATION_GPU_TYPES: ",".join(pod.gpu_spec)}
    return body


def _bridge_claim(i: int, pod: PodRecord) -> dict[str, Any]:
    claim = _claim(i, pod)
    claim["spec"]["devices"]["requests"][0]["exactly"].pop("selectors", None)
    return claim


def _judged(brains: Brains) -> bool:
    """Every job running, or pending with the scheduler's reason (none being started)."""
    jobs = brains.pool.get("/v1/jobs?limit=1000")["jobs"]
    return all(
        j["state"] == "RUNNING" or (j["state"] == "PENDING" and j["pending_reason"]) for j in jobs
    )


def bridge_packing(
    bins: Path, nodes: list[NodeRecord], pods: list[PodRecord], settle_s: float
) -> tuple[int, int, float]:
    """Allocated GPU milli and pods placed by gpupool's server through the bridge, and its
    seconds from the first pod created to the last bound."""
    folder = Path(tempfile.mkdtemp(prefix="bench-bridge-"))
    plane = ControlPlane(bins, folder)
    brains: Brains | None = None
    try:
        plane.start()
        client = plane.client
        client.apply(device_class(), field_manager="bench")
        for record in nodes:
            client.create("/api/v1/nodes", kwok_node(
                record.name, cpu=f"{record.cpu_milli}m", memory=f"{record.memory_mib}Mi",
                pods="1000",
            ))  # fmt: skip
            client.apply(_slice(record), field_manager="bench")
        brains = Brains(plane, folder / "gpupool")
        wait_for(lambda: len(brains.pool.get("/v1/nodes")) == len(nodes), what="nodes", timeout=600)
        client.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        )
        started = time.monotonic()
        for i, pod in enumerate(pods):
            if pod.num_gpu > 0:
                client.create(
                    f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
                    _bridge_claim(i, pod),
                )
            client.create(f"/api/v1/namespaces/{NS}/pods", _bridge_pod(i, pod))
        bound: set[int] = set()
        last_change = time.monotonic()
        while True:
            listed = client.list(f"/api/v1/namespaces/{NS}/pods")
            now_bound = {
                int(p["metadata"]["name"][1:]) for p in listed if p["spec"].get("nodeName")
            }
            submitted = all(ANNOTATION_JOB in (p["metadata"].get("annotations") or {})
                            for p in listed)  # fmt: skip
            if now_bound != bound:
                bound, last_change = now_bound, time.monotonic()
                time.sleep(1)
                continue
            quiet = time.monotonic() - last_change
            # every job judged; or, as a failsafe, nothing bound for 6 settles
            if submitted and quiet > settle_s and (quiet > 6 * settle_s or _judged(brains)):
                break
            time.sleep(1)
        seconds = last_change - started
    finally:
        if brains is not None:
            brains.close()
        plane.stop()
        if os.environ.get("GPUPOOL_KEEP_K8S"):
            print(f"logs kept in {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return sum(pods[i].total_gpu_milli for i in bound), len(bound), seconds


def _unschedulable(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("reason") == "Unschedulable" for c in conditions)


def kube_packing(
    plane: ControlPlane, nodes: list[NodeRecord], pods: list[PodRecord]
) -> tuple[int, int, float]:
    """Allocated GPU milli and pods placed by the real kube-scheduler, and its seconds."""
    client = plane.client
    client.apply(device_class(), field_manager="bench")
    for record in nodes:
        client.create(
            "/api/v1/nodes",
            kwok_node(
                record.name,
                cpu=f"{record.cpu_milli}m",
                memory=f"{record.memory_mib}Mi",
                pods="1000",
            ),
        )
        client.apply(_slice(record), field_manager="bench")
    client.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    )
    started = time.monotonic()
    for i, pod in enumerate(pods):
        if pod.num_gpu > 0:
            client.create(
                f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", _claim(i, pod)
            )
        client.create(f"/api/v1/namespaces/{NS}/pods", _pod(i, pod))
    while True:  # every pod bound or reported unschedulable
        listed = client.list(f"/api/v1/namespaces/{NS}/pods")
        decided = [p for p in listed if p["spec"].get("nodeName") or _unschedulable(p)]
        if len(decided) == len(pods):
            break
        time.sleep(1)
    seconds = time.monotonic() - started
    bound = {int(p["metadata"]["name"][1:]) for p in listed if p["spec"].get("nodeName")}
    return sum(pods[i].total_gpu_milli for i in bound), len(bound), seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ratio", type=float, default=1.3)
    p.add_argument("--policy", default="fragaware")
    p.add_argument("--json", action="store_true")
    p.add_argument("--bridge", action="store_true", help="also through gpupool's bridge")
    p.add_argument("--no-kube", action="store_true", help="skip the kube-scheduler's run")
    p.add_argument("--settle", type=float, default=10.0, help="bridge: seconds without a bind")
    args = p.parse_args()
    all_nodes = read_nodes(DATA / "openb_node_list_gpu_node.csv")
    rng = np.random.default_rng(args.seed)
    nodes = [all_nodes[int(i)] for i in rng.permutation(len(all_nodes))[: args.nodes]]
    pod_list = read_pods(DATA / "openb_pod_list_default.csv")
    capacity_milli = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    order = tune(np.asarray([x.total_gpu_milli for x in pod_list], dtype=np.int64), args.seed,
                 capacity_milli, args.ratio)  # fmt: skip
    pods = [pod_list[int(i)] for i in order]
    ours, ours_placed = gpupool_packing(nodes, pods, args.policy, args.seed)
    bins = find_binaries()
    if not isinstance(bins, Path):
        print(f"error: {bins}", file=sys.stderr)
        return 1
    result: dict[str, Any] = {
        "nodes": len(nodes),
        "gpus": capacity_milli // MILLI_PER_GPU,
        "pods": len(pods),
        f"gpupool_{args.policy}_alloc_pct": round(100 * ours / capacity_milli, 1),
        f"gpupool_{args.policy}_pods_placed": ours_placed,
    }
    if not args.no_kube:
        folder = Path(tempfile.mkdtemp(prefix="bench-pack-"))
        plane = ControlPlane(bins, folder)
        try:
            plane.start()
            theirs, placed, seconds = kube_packing(plane, nodes, pods)
        finally:
            plane.stop()
            shutil.rmtree(folder, ignore_errors=True)
        result["kube_scheduler_alloc_pct"] = round(100 * theirs / capacity_milli, 1)
        result["kube_scheduler_pods_placed"] = placed
        result["kube_scheduler_s"] = round(seconds, 1)
    if args.bridge:
        bridged, bridged_placed, bridged_s = bridge_packing(bins, nodes, pods, args.settle)
        result["gpupool_bridge_alloc_pct"] = round(100 * bridged / capacity_milli, 1)
        result["gpupool_bridge_pods_placed"] = bridged_placed
        result["gpupool_bridge_s"] = round(bridged_s, 1)
    result["loadavg"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
