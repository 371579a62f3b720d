"""How fast the real kube-scheduler places fractional gpupool claims, and how densely, at scale.

Starts the test control plane (``tests/kube/cluster.py``: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok; binaries from ``scripts/k8s-bins.sh``), adds
``--nodes`` kwok nodes, publishes ``--gpus`` simulated GPUs on each through gpupool's
``SlicePublisher`` (one publisher per node, as each node's plugin would, ``--workers`` at a
time), waits until kwok reports every node Ready, then creates ``--pods`` pods each with a claim
from one ResourceClaimTemplate (``--compute`` milli-GPU and ``--memory`` of one GPU) from
``--workers`` threads and follows the pods with a watch until every one is bound.

Prints: slices published per second, pods scheduled per second (first pod created to last pod
bound, which includes the controller manager making each pod's claim from the template), the
same over the middle 80 % of bindings (the steady rate, without the start and the tail), and
claims per GPU used (how many pods share each GPU the scheduler touched). Kubernetes' own DRA
scheduling floor in scheduler_perf is 40-70 pods/s.

What limits the rate on our side, and the flags that lift it:

- **client QPS of the controller manager and the scheduler** (``--component-qps``, default
  500; ``0`` keeps their defaults). By default the controller manager talks to the API server
  at 20 requests/s (burst 30) and makes two writes per pod (the claim from the template, the
  pod's ``resourceClaimStatuses``): about 10 pods/s, whatever the scheduler can do. The
  scheduler's default 50/s (burst 100) with two writes per pod (the claim's allocation, the
  binding) caps it at about 25 pods/s. Clusters at this scale raise both, as scheduler_perf
  does.
- **how the benchmark watches**: a watch on the namespace's pods, not a 5,000-pod list every
  half second (which, serialised by the API server, competes with the scheduler for the CPU).

- **who is measured**: by default pods are created while the scheduler runs, so the rate is
  at most how fast this one Python process creates pods; ``--backlog`` starts the scheduler only
  once every pod and its claim exist and measures it alone, as scheduler_perf does.
- **the scheduler's share of nodes** (``--nodes-to-score-pct``): by default it filters and
  scores 42 % of 1,000 nodes for each pod (at least 100); large clusters lower it.

If not every pod is bound within ``--timeout`` seconds it prints what it has (how many bound,
the rate so far) and exits 1, so the largest run that fits a machine is still measured.

    .venv/bin/python benchmarks/bench_kube_dra.py --nodes 4 --pods 60
    flock /work/briefs/heavy.lock .venv/bin/python benchmarks/bench_kube_dra.py \\
        --nodes 1000 --pods 5000   # the issue's scale
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kube.cluster import ControlPlane, find_binaries, kwok_node

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.client import KubeClient, KubeConfig
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import device_class

NAMESPACE = "bench"


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


def component_args(qps: int, score_pct: int, folder: Path) -> dict[str, list[str]]:
    """The controller manager's and scheduler's client QPS and burst (``qps`` 0: their
    defaults) and, with ``score_pct``, the scheduler's ``percentageOfNodesToScore`` (a
    configuration file then, which carries the scheduler's client settings too)."""
    flags = [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"] if qps > 0 else []
    args = {"kube-controller-manager": list(flags), "kube-scheduler": list(flags)}
    if score_pct > 0:
        client: dict[str, object] = {"kubeconfig": str(folder / "kube-scheduler.kubeconfig")}
        if qps > 0:
            client |= {"qps": qps, "burst": 2 * qps}
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": client,
            "leaderElection": {"leaderElect": False},
            "percentageOfNodesToScore": score_pct,
        }
        path = folder / "kube-scheduler.config.json"
        path.write_text(json.dumps(config))
        args["kube-scheduler"] = [f"--config={path}"]
    return args


class BindWatch:
    """Follows the pods of a namespace with one watch; the time each was first seen bound."""

    def __init__(self, config: KubeConfig, namespace: str, resource_version: str) -> None:
        self.bound: dict[str, float] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._http = httpx.Client(
            base_url=config.server, verify=config.ssl_context(), headers=headers, timeout=None
        )
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._rv = resource_version
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            params = {"watch": "1", "resourceVersion": self._rv, "allowWatchBookmarks": "true"}
            try:
                with self._http.stream("GET", self._path, params=params) as answer:
                    if answer.status_code != 200:
                        self.error = f"watch answered {answer.status_code}"
                        return
                    for line in answer.iter_lines():
                        if line:
                            self._event(json.loads(line))
                        if self._stop.is_set():
                            return
            except httpx.HTTPError:
                if self._stop.is_set():
                    return
                time.sleep(0.5)  # the API server closes watches now and then: resume

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self._rv = meta["resourceVersion"]
        if event.get("type") == "ERROR":
            self.error = str(obj.get("message"))
            self._stop.set()
            return
        name = meta.get("name")
        if name and name not in self.bound and (obj.get("spec") or {}).get("nodeName"):
            self.bound[name] = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._http.close()


def _parallel(workers: int, fn: Callable[[Any], object], items: Iterable[Any]) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass


def _nodes_ready(client: KubeClient, expected: int) -> int:
    ready = 0
    for node in client.list("/api/v1/nodes", label_selector="type=kwok"):
        conditions = node.get("status", {}).get("conditions") or []
        ready += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready


def _wait_claims(client: KubeClient, expected: int, timeout_s: float) -> None:
    """Until the controller manager made every pod's claim from the template."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    deadline = time.monotonic() + timeout_s
    while len(client.list(path)) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"error: fewer than {expected} claims made in {timeout_s:.0f} s")
        time.sleep(5)


def _claims_per_gpu(client: KubeClient) -> tuple[int, int]:
    """(claims allocated, distinct GPUs they use)."""
    claims = client.list(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
    used = set()
    allocated = 0
    for claim in claims:
        results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results")
        if results:
            allocated += 1
            used |= {(r["pool"], r["device"]) for r in results}
    return allocated, len(used)


def _steady_rate(times: list[float]) -> float:
    """Pods per second between the 10th and the 90th percentile binding."""
    if len(times) < 10:
        return 0.0
    times = sorted(times)
    lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
    count = (len(times) * 9) // 10 - len(times) // 10
    return count / max(hi - lo, 1e-6)


def measure(args: argparse.Namespace, plane: ControlPlane) -> dict[str, Any]:
    client = plane.client
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus": args.nodes * args.gpus,
        "pods": args.pods,
        "share": f"{args.compute} compute, {args.memory}",
        "component_qps": args.component_qps or "defaults",
        "nodes_to_score_pct": args.nodes_to_score_pct or "adaptive",
        "mode": "backlog" if args.backlog else "streaming",
    }
    client.apply(device_class(), field_manager="bench")
    names = [f"bench-{i:04d}" for i in range(args.nodes)]
    t0 = time.monotonic()
    _parallel(args.workers, lambda name: client.create(
        "/api/v1/nodes", kwok_node(name, cpu="256", memory="2Ti", pods="500")), names)  # fmt: skip
    result["nodes_created_per_s"] = round(args.nodes / (time.monotonic() - t0), 1)
    spec = f"{args.gpus}x{args.model}"
    t0 = time.monotonic()
    _parallel(args.workers, lambda name: SlicePublisher(
        client, SimulatedBackend.from_spec(spec, node=name), name).sync(), names)  # fmt: skip
    result["slices_published_per_s"] = round(args.nodes / (time.monotonic() - t0), 1)
    t0 = time.monotonic()
    while (ready := _nodes_ready(client, args.nodes)) < args.nodes:
        if time.monotonic() - t0 > args.timeout:
            raise SystemExit(f"error: only {ready} of {args.nodes} kwok nodes Ready")
        time.sleep(2)
    result["nodes_ready_s"] = round(time.monotonic() - t0, 1)
    client.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    client.create(
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
        _template(NAMESPACE, args.compute, args.memory),
    )
    listing = client.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    watch = BindWatch(client.config, NAMESPACE, listing["metadata"]["resourceVersion"])
    try:
        t0 = time.monotonic()
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        _parallel(args.workers, lambda i: client.create(pods, _pod(i, NAMESPACE)), range(args.pods))
        result["pod_create_s"] = round(time.monotonic() - t0, 1)
        if args.backlog:
            _wait_claims(client, args.pods, args.timeout)
            result["claims_made_s"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            plane.start_scheduler()
            result["scheduler_start_s"] = round(time.monotonic() - t0, 1)
        last_report = t0
        while len(watch.bound) < args.pods and watch.error is None:
            now = time.monotonic()
            if now - t0 > args.timeout:
                break
            if now - last_report >= 30:
                print(f"  {now - t0:5.0f} s: {len(watch.bound)} of {args.pods} pods bound",
                      file=sys.stderr)  # fmt: skip
                last_report = now
            time.sleep(0.2)
        times = list(watch.bound.values())
    finally:
        watch.close()
    if watch.error is not None:
        raise SystemExit(f"error: the pod watch failed: {watch.error}")
    bound = len(times)
    span = (max(times) - t0) if times else time.monotonic() - t0
    result["pods_bound"] = bound
    result["schedule_s"] = round(span, 1)
    result["pods_scheduled_per_s"] = round(bound / max(span, 1e-6), 1)
    result["steady_pods_per_s"] = round(_steady_rate(times), 1)
    allocated, gpus_used = _claims_per_gpu(client)
    result["claims_allocated"] = allocated
    result["gpus_used"] = gpus_used
    result["claims_per_gpu_used"] = round(allocated / max(1, gpus_used), 2)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    p.add_argument("--model", default="A100-80GB")
    p.add_argument("--pods", type=int, default=60)
    p.add_argument("--compute", default="250", help="milli-GPU per claim (1000: a whole GPU)")
    p.add_argument("--memory", default="10Gi", help="GPU memory per claim (a quantity)")
    p.add_argument("--workers", type=int, default=8, help="threads creating nodes and pods")
    p.add_argument(
        "--component-qps", type=int, default=500,
        help="client QPS of the controller manager and scheduler (burst twice); 0: defaults",
    )  # fmt: skip
    p.add_argument(
        "--nodes-to-score-pct", type=int, default=0,
        help="the scheduler's percentageOfNodesToScore; 0: its adaptive default (42 %% of "
        "1,000 nodes, at least 100 nodes)",
    )  # fmt: skip
    p.add_argument(
        "--backlog", action="store_true",
        help="start the scheduler only once every pod and its claim exist: the rate is then "
        "the scheduler's alone, from its start to the last binding (as scheduler_perf measures), "
        "not bounded by how fast this process creates pods",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for bindings")
    p.add_argument("--keep", action="store_true", help="keep the control plane's folder")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    bins = find_binaries()
    if not isinstance(bins, Path):
        print(f"error: {bins}", file=sys.stderr)
        return 1
    # A SIGTERM (``timeout``) stops the control plane too: its processes have sessions of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    load_before = os.getloadavg()[0]
    extra = component_args(args.component_qps, args.nodes_to_score_pct, folder)
    plane = ControlPlane(bins, folder, extra_args=extra)
    try:
        t0 = time.monotonic()
        plane.start(scheduler=not args.backlog)
        started_s = round(time.monotonic() - t0, 1)
        result = {"control_plane_start_s": started_s, **measure(args, plane)}
    finally:
        plane.stop()
        if args.keep:
            print(f"control plane folder kept: {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    result["loadavg_before_after"] = f"{load_before:.1f}-{os.getloadavg()[0]:.1f}"
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:26} {value}")
    return 0 if result["pods_bound"] == args.pods else 1


if __name__ == "__main__":
    sys.exit(main())
