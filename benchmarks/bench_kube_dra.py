"""How fast the real kube-scheduler places fractional gpupool claims, and how densely.

Starts the test control plane (``tests/kube/cluster.py``: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok; binaries from ``scripts/k8s-bins.sh``), adds
``--nodes`` kwok nodes, publishes ``--gpus`` simulated GPUs on each through gpupool's
``SlicePublisher``, then creates ``--pods`` pods each with a claim from a template
(``--compute`` and ``--memory`` of one GPU) and waits until every pod is bound.

Prints: slices published per second, pods scheduled per second (first pod created to last pod
bound, which includes the controller manager making each pod's claim from the template), and
claims per GPU used (how many pods share each GPU the scheduler touched). Kubernetes' own DRA
scheduling floor in scheduler_perf is 40-70 pods/s.

    .venv/bin/python benchmarks/bench_kube_dra.py --nodes 4 --pods 60
    .venv/bin/python benchmarks/bench_kube_dra.py --nodes 1000 --pods 5000   # the issue's scale
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kube.cluster import ControlPlane, find_binaries, kwok_node

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import device_class


def _template(namespace: str, compute: str, memory: str) -> dict[str, object]:
    request = {
        "deviceClassName": "gpu.gpupool.io",
        "capacity": {"requests": {"compute": compute, "memory": memory}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "share", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def _pod(i: int, namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--model", default="A100-80GB")
    p.add_argument("--pods", type=int, default=60)
    p.add_argument("--compute", default="250", help="milli-GPU")
    p.add_argument("--memory", default="10Gi")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    bins = find_binaries()
    if not isinstance(bins, Path):
        print(f"error: {bins}", file=sys.stderr)
        return 1
    folder = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    plane = ControlPlane(bins, folder)
    try:
        t0 = time.monotonic()
        plane.start()
        started_s = time.monotonic() - t0
        client = plane.client
        client.apply(device_class(), field_manager="bench")
        names = [f"bench-{i:04d}" for i in range(args.nodes)]
        for name in names:
            client.create("/api/v1/nodes", kwok_node(name, cpu="256", memory="2Ti", pods="500"))
        t0 = time.monotonic()
        spec = f"{args.gpus}x{args.model}"
        for name in names:
            SlicePublisher(client, SimulatedBackend.from_spec(spec, node=name), name).sync()
        publish_s = time.monotonic() - t0
        ns = "bench"
        client.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        )
        client.create(
            f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
            _template(ns, args.compute, args.memory),
        )
        t0 = time.monotonic()
        for i in range(args.pods):
            client.create(f"/api/v1/namespaces/{ns}/pods", _pod(i, ns))
        created_s = time.monotonic() - t0
        while True:
            pods = client.list(f"/api/v1/namespaces/{ns}/pods")
            bound = sum(1 for x in pods if x["spec"].get("nodeName"))
            if bound == args.pods:
                break
            if time.monotonic() - t0 > 1800:
                print(
                    f"error: only {bound} of {args.pods} pods bound after 30 min", file=sys.stderr
                )
                return 1
            time.sleep(0.5)
        schedule_s = time.monotonic() - t0
        claims = client.list(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
        used = {
            (r["pool"], r["device"])
            for c in claims
            for r in c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        }
        result = {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus,
            "pods": args.pods,
            "share": f"{args.compute} compute, {args.memory}",
            "control_plane_start_s": round(started_s, 1),
            "slices_published_per_s": round(args.nodes / publish_s, 1),
            "pod_create_s": round(created_s, 1),
            "pods_scheduled_per_s": round(args.pods / schedule_s, 1),
            "gpus_used": len(used),
            "claims_per_gpu_used": round(len(claims) / max(1, len(used)), 2),
            "loadavg": os.getloadavg()[0],
        }
        if args.json:
            print(json.dumps(result))
        else:
            for key, value in result.items():
                print(f"{key:26} {value}")
        return 0
    finally:
        plane.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
