"""gpupool's server and the bridge beside a test control plane (the tests' and the packing
benchmark's): ``gpupool server`` from ``tests/e2e/pool.py`` and ``python -m gpupool.kube bridge``
as its own process, with an admin token and an agent token."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

from gpupool.gpu.simulated import SimulatedBackend
from gpupool.kube.publisher import SlicePublisher
from gpupool.kube.slices import device_class
from tests.e2e.pool import PY, Pool
from tests.kube.cluster import ControlPlane
from tests.readiness import wait_ready


class Brains:
    """The gpupool server and the bridge beside the test cluster."""

    def __init__(self, plane: ControlPlane, root: Path, *, kubeconfig: Path | None = None) -> None:
        """``kubeconfig``: the bridge's credentials (default: the cluster's admin)."""
        self.plane = plane
        self.kubeconfig = kubeconfig or plane.admin_kubeconfig
        self.pool = Pool(root)
        self.pool.start_server()
        self.token = (self.pool.home / "admin-token").read_text().strip()
        self.log = root / "bridge.log"
        self.proc = self._start_bridge()

    def _start_bridge(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [PY, "-m", "gpupool.kube", "bridge", "--server", self.pool.url,
                 "--token-file", str(self.pool.home / "admin-token"),
                 "--agent-token-file", str(self.pool.agent_token),
                 "--kubeconfig", str(self.kubeconfig), "--interval", "0.5"],
                env=self.pool._env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def restart_bridge(self) -> None:
        """Kills the bridge (SIGKILL: nothing saved on the way out) and starts a new one."""
        self.proc.kill()
        self.proc.wait()
        self.proc = self._start_bridge()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.pool.close()

    def gpu_node(self, spec: str = "1xA10") -> str:
        """A kwok node with gpupool's slice; ready once gpupool lists it as an up node."""
        node = f"kwok-{uuid.uuid4().hex[:8]}"
        self.plane.add_kwok_node(node)
        self.plane.client.apply(device_class(), field_manager="gpupool-tests")
        SlicePublisher(self.plane.client, SimulatedBackend.from_spec(spec, node=node), node).sync()
        wait_ready(
            lambda: (n := self.pool.node(node)) is not None and n["state"] == "up",
            what=f"gpupool node {node} registered by the bridge", proc=self.proc, log=self.log,
            failsafe_s=300,
        )  # fmt: skip
        return node

    def job(self, job_id: str) -> dict[str, Any]:
        return self.pool.job(job_id)
