"""``gpupool precheck --kubernetes`` against the real control plane, before and after deploying.

Before: the API, DRA and consumable capacity pass; the DeviceClass and this node's plugin fail,
each with what to do. After the driver runs for the node (``python -m gpupool.kube``, the
DaemonSet's process), every Kubernetes check passes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from gpupool.kube.slices import DEVICE_CLASS, DRIVER
from tests.kube.cluster import ControlPlane
from tests.readiness import wait_ready

#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def _precheck(env: dict[str, str]) -> tuple[int, dict[str, dict[str, str]]]:
    done = subprocess.run(
        [sys.executable, "-c", "from gpupool.cli.main import main; main()", "precheck",
         "--kubernetes", "--json",
         "--only", "disk"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    return done.returncode, {r["name"]: r for r in rows}


def test_precheck_kubernetes_says_what_is_missing_then_passes(
    control_plane: ControlPlane,
) -> None:
    client = control_plane.client
    node = f"kwok-pre-{uuid.uuid4().hex[:6]}"
    control_plane.add_kwok_node(node)
    kubelet = Path(tempfile.mkdtemp(prefix="gpk-", dir="/tmp"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "KUBECONFIG": str(control_plane.admin_kubeconfig),
        "NODE_NAME": node,
        "GPUPOOL_KUBELET_DIR": str(kubelet),
    }
    client.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{DEVICE_CLASS}")
    code, rows = _precheck(env)
    assert code == 1
    for name in ("k8s-api", "k8s-dra", "k8s-capacity"):
        assert rows[name]["status"] == "PASS", rows[name]
    assert "v1.37.2" in rows["k8s-api"]["detail"]
    assert rows["k8s-class"]["status"] == "FAIL"
    assert "kubectl apply --server-side -k deploy/kubernetes/" in rows["k8s-class"]["fix"]
    assert rows["k8s-plugin"]["status"] == "FAIL"
    assert "gpupool-node DaemonSet" in rows["k8s-plugin"]["fix"]

    log = kubelet / "driver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.kube", "--simulate", "2xL4",
             "--kubelet-dir", str(kubelet), "--cdi-dir", str(kubelet / "cdi")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        registry = kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
        wait_ready(registry.exists, what="the driver's sockets", proc=proc, log=log)
        _, rows = _precheck(env)
        for name in ("k8s-api", "k8s-dra", "k8s-capacity", "k8s-class", "k8s-plugin"):
            assert rows[name]["status"] == "PASS", rows[name]
        assert "2 GPU(s) published" in rows["k8s-plugin"]["detail"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        shutil.rmtree(kubelet, ignore_errors=True)
