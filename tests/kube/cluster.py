"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, each the upstream binary built by ``scripts/k8s-bins.sh``.

Nothing here stands in for Kubernetes: the API server validates every object, the real
scheduler's DRA plugin allocates claims from the ResourceSlices gpupool publishes, the
controller manager makes claims from templates and runs DaemonSets and Deployments, and kwok
plays the kubelets of Nodes annotated ``kwok.x-k8s.io/node: fake`` (Node leases, pods marked
Running). There is no kubelet and no container runtime: the kubelet plugin is called over its
real gRPC socket by the tests, as the kubelet would.

Each :class:`ControlPlane` lives in its own folder (PKI, etcd data, kubeconfigs, logs) with its
own free ports, so two test sessions never meet. The admin identity (``system:masters``) is the
tests'; the scheduler and controller manager use it too (a test cluster, no bootstrap RBAC to
wait for). Readiness waits are on the components' own answers, with the suite's generous
failsafe, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpupool.kube.client import KubeClient, KubeConfig, KubeError
from tests.kube.pki import Pki, kubeconfig, make_pki
from tests.ports import free_port
from tests.readiness import wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
BINS_SCRIPT = REPO_ROOT / "scripts" / "k8s-bins.sh"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
STAGES = Path(__file__).with_name("kwok-stages.yaml")

#: The control plane's components are heavy Go binaries; on a loaded 2-core machine the API
#: server alone takes a minute or more to serve its first /readyz.
START_FAILSAFE_S = 420.0
#: How long a component may take to stop on SIGTERM before it is killed.
STOP_GRACE_S = 30.0


def find_binaries() -> Path | str:
    """The folder of built binaries, or why there is none (a one-line reason)."""
    try:
        done = subprocess.run(
            ["bash", str(BINS_SCRIPT), "--print"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {BINS_SCRIPT}: {exc}"
    if done.returncode != 0:
        return (
            "the Kubernetes control plane binaries are not built: run scripts/k8s-bins.sh "
            "(Go modules; about 40 minutes on a shared 2-core machine the first time, cached after)"
        )
    return Path(done.stdout.strip())


def kwok_node(name: str, *, cpu: str, memory: str, pods: str = "110") -> dict[str, Any]:
    """A Node object kwok takes (its annotation) with this allocatable capacity."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
        },
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }


class ControlPlane:
    """The processes and the admin client of one test cluster."""

    def __init__(
        self, bins: Path, folder: Path, *, extra_args: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """``extra_args``: more flags per component (``"kube-scheduler": [...]``), appended to
        its command line (the scale benchmark raises the components' API QPS with them)."""
        self.bins = bins
        self.folder = folder
        self.extra_args = dict(extra_args or {})
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pki: Pki = make_pki(folder / "pki")
        self.etcd_port = free_port()
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.admin_kubeconfig = kubeconfig(
            folder / "admin.kubeconfig", self.server, self.pki, "admin"
        )
        self._client: KubeClient | None = None

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [*argv, *self.extra_args.get(name, ())], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.folder,
        )  # fmt: skip
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def _text(self, name: str) -> str:
        return self.log(name).read_text(errors="replace")

    def _wait(self, name: str, probe: Callable[[], object]) -> None:
        def attempt() -> object:
            try:
                return probe()
            except (KubeError, OSError):
                return None

        wait_ready(
            attempt, what=name, proc=self.procs[name], log=self.log(name),
            failsafe_s=START_FAILSAFE_S,
        )  # fmt: skip

    def start(self, *, scheduler: bool = True) -> None:
        """Every component; ``scheduler=False`` leaves the kube-scheduler for
        :meth:`start_scheduler` (the scale benchmark lets a backlog of pods build up first)."""
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()
        if scheduler:
            self.start_scheduler()
        self._start_kwok()

    def _start_etcd(self) -> None:
        peer = free_port()
        self._spawn("etcd", [
            str(self.bins / "etcd"), "--name", "default",
            "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])  # fmt: skip

        def healthy() -> bool:
            import httpx

            try:  # not listening yet (refused) or too slow to answer: not ready yet
                answer = httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=5)
            except httpx.HTTPError:
                return False
            return answer.status_code == 200 and '"health":"true"' in answer.text

        self._wait("etcd", healthy)

    def _start_apiserver(self) -> None:
        pki = self.pki
        self._spawn("kube-apiserver", [
            str(self.bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki.cert('apiserver')}",
            f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca_cert}",
            f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
            f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # resource.k8s.io/v1 is GA and served by default in 1.37; consumable capacity
            # (shared devices) is beta and on by default: named here so that a version that
            # turns it off fails loudly instead of scheduling whole GPUs.
            "--feature-gates=DRAConsumableCapacity=true",
            "--profiling=false", "--v=1",
        ])  # fmt: skip
        self._wait("kube-apiserver", self.client.ready)

    def _component_kubeconfig(self, name: str) -> Path:
        return kubeconfig(self.folder / f"{name}.kubeconfig", self.server, self.pki, "admin")

    def _start_controller_manager(self) -> None:
        config = self._component_kubeconfig("kube-controller-manager")
        self._spawn("kube-controller-manager", [
            str(self.bins / "kube-controller-manager"),
            f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", "--secure-port=0",
            "--leader-elect=false", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--feature-gates=DRAConsumableCapacity=true",
            "--v=1",
        ])  # fmt: skip
        # Ready when its service account controller made the default namespace's account.
        self._wait(
            "kube-controller-manager",
            lambda: self.client.get("/api/v1/namespaces/default/serviceaccounts/default"),
        )

    def start_scheduler(self) -> None:
        config = self._component_kubeconfig("kube-scheduler")
        self._spawn("kube-scheduler", [
            str(self.bins / "kube-scheduler"),
            f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
            "--feature-gates=DRAConsumableCapacity=true",
            "--v=2",
        ])  # fmt: skip
        # The scheduler has no health port here (secure-port 0): ready once it logs that it
        # started its informers; a pod test waits on scheduling anyway.
        started = "Starting Kubernetes Scheduler"
        self._wait("kube-scheduler", lambda: started in self._text("kube-scheduler"))

    def _start_kwok(self) -> None:
        config = self._component_kubeconfig("kwok")
        self._spawn("kwok", [
            str(self.bins / "kwok"),
            f"--kubeconfig={config}", f"--config={STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--cidr=10.244.0.0/16", "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=40",
        ])  # fmt: skip
        # kwok logs "Watch nodes" once its controllers run; a node test then waits on Ready.
        self._wait("kwok", lambda: "Watch nodes" in self._text("kwok"))

    def stop(self) -> None:
        """Each component in the reverse of its start, each gone before the next is told: the
        API server's graceful shutdown still writes to etcd (its lease), and with etcd stopped
        under it, it hung until killed (30 s of every session's teardown)."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._client is not None:
            self._client.close()

    # -- the API -----------------------------------------------------------------------------

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            self._client = KubeClient(KubeConfig.from_kubeconfig(self.admin_kubeconfig))
        return self._client

    def add_kwok_node(self, name: str, *, cpu: str = "32", memory: str = "256Gi") -> dict[str, Any]:
        """A Node kwok plays the kubelet of; Ready once kwok has taken it."""
        created = self.client.create("/api/v1/nodes", kwok_node(name, cpu=cpu, memory=memory))
        wait_ready(
            lambda: self.node_ready(name), what=f"kwok node {name}", proc=self.procs["kwok"],
            log=self.log("kwok"), failsafe_s=START_FAILSAFE_S,
        )  # fmt: skip
        return created

    def node_ready(self, name: str) -> bool:
        node = self.client.get(f"/api/v1/nodes/{name}")
        conditions = node.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def alive(self) -> dict[str, int | None]:
        """Each component's exit code, ``None`` while it runs."""
        return {name: proc.poll() for name, proc in self.procs.items()}
