"""The CDI device the kubelet plugin prepared, applied by a real container engine (podman).

The claim is one the real kube-scheduler allocated (half an A10 and 10 GiB); the plugin's
NodePrepareResources writes its CDI spec into ``/var/run/cdi`` (where podman, containerd and
CRI-O read specs) and answers the device ID. ``podman run --device <that ID>`` then runs a CUDA
program (the shim tests' probe, which finds ``libcuda.so.1`` as the CUDA runtime does) in a
busybox image that holds no driver and no gpupool file: everything it gets comes from the CDI
edits (the shim's façade first on the library path, the fake driver as the real one, the
claim's region). The probe is held to the claim's 10 GiB: 8 GiB is granted, 4 GiB more is
refused as out of memory, and the region the plugin made shows the 8 GiB in use.

Root and podman with runc are needed (``.ci/services.sh`` installs them); under ``CI=true`` a
machine without them fails, elsewhere the test skips with why.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from gpupool.runtime.shim import Region
from tests.conftest import IN_CI
from tests.kube.cluster import ControlPlane
from tests.kube.nodes import Node, prepare, scheduled_claim
from tests.shim.helpers import Natives

GIB = 1 << 30
CDI_DIR = Path("/var/run/cdi")
#: The engine settings gpupool's container jobs use on this kind of machine (runc, cgroupfs, no
#: default ulimits: raising them is refused here).
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


#: A real control plane on a loaded 2-core machine: starts, schedules and waits are slow.
pytestmark = pytest.mark.timeout(900)


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and podman cannot run here: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if os.geteuid() != 0:
        _unavailable("podman with CDI devices from /var/run/cdi needs root")
    if shutil.which("podman") is None or shutil.which("runc") is None:
        _unavailable("podman or runc is not installed (.ci/services.sh installs them)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _image(env: dict[str, str], probe: Path, folder: Path) -> str:
    """busybox and the probe (with the C library it links), nothing of the driver or gpupool."""
    busybox = shutil.which("busybox")
    if busybox is None:
        _unavailable("busybox-static is not installed (.ci/services.sh installs it)")
    assert busybox is not None
    libs = subprocess.run(["ldd", str(probe)], capture_output=True, text=True, check=True).stdout
    copies = [Path(w) for line in libs.splitlines() for w in line.split() if w.startswith("/")]
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        tar.add(busybox, "bin/busybox")
        for applet in ("sh", "cat", "ls"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        tar.add(str(probe), "probe")
        for lib in copies:
            tar.add(str(lib.resolve()), str(lib).lstrip("/"))
    archive = folder / "image.tar"
    archive.write_bytes(tar_bytes.getvalue())
    image = f"localhost/gpupool-kube-probe:{uuid.uuid4().hex[:8]}"
    done = subprocess.run(["podman", "import", str(archive), image], env=env,
                          capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
    if done.returncode != 0:
        _unavailable(f"podman import failed: {done.stderr.strip()[-500:]}")
    return image


def test_the_prepared_cdi_device_holds_a_cuda_program_in_podman_to_its_10_gib(
    control_plane: ControlPlane,
    namespace: str,
    natives: Natives,
    podman_env: dict[str, str],
    tmp_path: Path,
) -> None:

    node = Node(control_plane, natives, tmp_path, "1xA10", cdi_dir=CDI_DIR)
    node.start_plugin()
    image = _image(podman_env, natives.probe, tmp_path)
    try:
        claim = scheduled_claim(control_plane, namespace, node.name)
        uid = claim["metadata"]["uid"]
        _, answer = prepare(node, namespace, claim)
        assert answer.claims[uid].error == ""
        (cdi_id,) = answer.claims[uid].devices[0].cdi_device_ids
        commands = f"init\nalloc {8 * GIB}\nalloc {4 * GIB}\nalloc {GIB}\n"
        run = subprocess.run(
            ["podman", "run", "--rm", "-i", "--network=none", "--device", cdi_id, image,
             "/probe"],
            input=commands, env=podman_env, capture_output=True, text=True, check=False,
            timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        lines = run.stdout.split("\n")
        assert lines[0] == "ok", run.stdout  # init, through the façade, in the container
        assert lines[1].startswith("ok "), run.stdout  # 8 GiB of the claim's 10
        assert lines[2] == "err 2", run.stdout  # 4 GiB more: CUDA_ERROR_OUT_OF_MEMORY
        assert lines[3].startswith("ok "), run.stdout  # 1 GiB still fits
        prepared = node.plugin.dra.preparer.prepared[uid]  # type: ignore[union-attr]
        gpu = node.backend.inventory()[0]
        with Region.open(Path(prepared.region), build=natives.shim) as region:
            assert region.read().device(gpu.uuid).mem_limit_bytes == 10 * GIB
    finally:
        if node.plugin is not None:  # its specs out of the node's shared CDI folder
            for uid in list(node.plugin.dra.preparer.prepared):
                node.plugin.dra.preparer.unprepare(uid)
        node.stop_plugin()
        subprocess.run(["podman", "rmi", "-f", image], env=podman_env, capture_output=True,
                       check=False, timeout=120)  # fmt: skip
