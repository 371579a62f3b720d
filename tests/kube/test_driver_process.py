"""``python -m gpupool.kube``, the DaemonSet's process, run for real against the test cluster.

It must publish its node's slice and the DeviceClass, serve the registration and DRA sockets
under the kubelet folder it is given, keep serving while it publishes, and on SIGTERM stop and
take its sockets away (a kubelet must not find a dead endpoint).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.kube.grpcapi import REGISTRATION_SERVICE
from gpupool.kube.proto import registration_v1_pb2 as reg
from gpupool.kube.slices import DEVICE_CLASS, DRIVER, slice_name
from tests.kube.cluster import ControlPlane
from tests.kube.nodes import call
from tests.kube.objects import wait_for
from tests.readiness import wait_ready

#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: unix socket paths hold at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="gpk-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_driver_process_publishes_serves_and_stops_cleanly(
    control_plane: ControlPlane, short_dir: Path
) -> None:
    tmp_path = short_dir
    client = control_plane.client
    node = f"kwok-proc-{uuid.uuid4().hex[:6]}"
    control_plane.add_kwok_node(node)
    kubelet = tmp_path / "kubelet"
    log = tmp_path / "driver.log"
    env = {**os.environ, "NODE_NAME": node, "PYTHONPATH": os.pathsep.join(sys.path)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.kube", "--simulate", "4xA100-80GB",
             "--kubeconfig", str(control_plane.admin_kubeconfig),
             "--kubelet-dir", str(kubelet), "--cdi-dir", str(tmp_path / "cdi"),
             "--interval", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    registry = kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
    dra = kubelet / "plugins" / DRIVER / "dra.sock"
    try:
        wait_ready(registry.exists, what="the driver's sockets", proc=proc, log=log)
        info = call(registry, REGISTRATION_SERVICE, "GetInfo", reg.InfoRequest(), reg.PluginInfo)
        assert (info.name, info.endpoint) == (DRIVER, str(dra))
        assert dra.exists()
        stored = wait_for(
            lambda: client.get_or_none(
                f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(node)}"
            ),
            "the driver's slice",
        )
        assert [d["name"] for d in stored["spec"]["devices"]] == [f"gpu-{i}" for i in range(4)]
        owner = stored["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Node", node)
        assert client.get(f"/apis/resource.k8s.io/v1/deviceclasses/{DEVICE_CLASS}")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0, log.read_text()
    assert not registry.exists()
    assert not dra.exists()


def test_a_socket_path_too_long_is_refused_with_what_to_do(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    node = f"kwok-long-{uuid.uuid4().hex[:6]}"
    control_plane.add_kwok_node(node)
    kubelet = tmp_path / ("k" * 90)
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.kube", "--node", node, "--simulate", "1xT4",
         "--kubeconfig", str(control_plane.admin_kubeconfig), "--kubelet-dir", str(kubelet),
         "--cdi-dir", str(tmp_path / "cdi")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "longer than a unix socket allows" in done.stderr
    assert "give a shorter --kubelet-dir" in done.stderr
