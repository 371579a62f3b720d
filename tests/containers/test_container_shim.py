"""A CUDA program in a container, held to its slice by the shim, with the fake driver as the
node's driver (``tests/shim``: the fake ``libcuda.so.1`` and the probe, a CUDA program).

The agent's node has the fake driver as its "real" one (``GPUPOOL_REAL_LIBCUDA``), as in
``tests/shim/test_shim_pool.py``; the job runs in a busybox image that holds the C library and
nothing of CUDA. Everything CUDA comes from the slice's CDI edits: the shim's façade first on
``LD_LIBRARY_PATH``, the node's driver under ``/usr/local/gpupool/driver``, the replica's region.
The probe and the out folder are mounted at their node paths (``--container-mounts``).
The program must be held exactly as the same job run bare is (see the shim pool's test).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.runtime.shim import Region
from gpupool.shim.build import ensure_built
from tests.containers.conftest import build_rootfs, import_image
from tests.e2e.pool import wait_for
from tests.shim.helpers import Natives, build_natives
from tests.shim.test_shim_pool import DEADLINE_S, ShimPool

GIB = 1 << 30


def libraries_of(*programs: Path) -> list[Path]:
    """The shared libraries (and the loader) the programs need, as ``ldd`` lists them."""
    found: list[Path] = []
    for program in programs:
        out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            for word in line.split():
                if word.startswith("/") and Path(word).exists() and Path(word) not in found:
                    found.append(Path(word))
    return found


@pytest.fixture(scope="module")
def shim_root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpupool-cshim-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cnatives(shim_root: Path) -> Natives:
    if shutil.which("cc") is None:
        pytest.skip("the shim needs a C compiler (cc)")
    return build_natives(shim_root / "natives", ensure_built(cache=shim_root / "cache"))


@pytest.fixture(scope="module")
def glibc_image(podman_env: dict[str, str], cnatives: Natives, shim_root: Path) -> str:
    """busybox with the C library the probe, the fake driver and the shim's façade need."""
    shim = cnatives.shim
    libs = libraries_of(cnatives.probe, cnatives.fake, cnatives.fake_nvml, shim.facade)
    copies = [p for p in libs if "gpupool" not in str(p) and shim_root not in p.parents]
    return import_image(podman_env, "gpupool-test-glibc", build_rootfs(copies=copies), shim_root)


@pytest.fixture(scope="module")
def cshim_pool(cnatives: Natives, shim_root: Path) -> Iterator[ShimPool]:
    p = ShimPool(shim_root / "pool", cnatives)
    try:
        p.start_server()
        p.start_agent("n1", "2xA100-80GB")
        yield p
    finally:
        p.close()


def test_a_program_in_a_container_allocates_through_the_shim_and_is_refused_past_its_slice(
    cshim_pool: ShimPool, glibc_image: str, cnatives: Natives
) -> None:
    name = "incontainer"
    natives = str(cnatives.probe.parent)
    container = {
        "image": glibc_image,
        "mounts": [f"{natives}:{natives}:ro", f"{cshim_pool.out}:{cshim_pool.out}"],
    }
    job_id = cshim_pool.probe_job(
        name,
        ["init", "info", f"alloc {8 * GIB}", "alloc 1"],
        isolation="shim",
        resources={"gpus": "0.5", "gpu_memory": "8GiB"},
        container=container,
    )
    answers = cshim_pool.answers(name, 4)
    assert answers[0] == ["ok"], answers
    assert answers[1][2] == str(8 * GIB)  # cuMemGetInfo's total is the slice
    assert answers[2][0] == "ok"
    assert answers[3] == ["err", "2"]  # CUDA_ERROR_OUT_OF_MEMORY at the slice's limit
    assert "slice" in (cshim_pool.out / f"{name}.err").read_text()
    # The façade first, then the node's driver: both from the CDI edits, none from the image.
    ldpath = (cshim_pool.out / f"{name}.ldpath").read_text().strip()
    assert ldpath == "/usr/local/gpupool/shim:/usr/local/gpupool/driver"
    job = wait_for(
        lambda: (j := cshim_pool.job(job_id))["isolation"] == "shim" and j,
        DEADLINE_S,
        "the job reported as shimmed (its process attached to its region)",
    )
    assert job["state"] == "RUNNING"
    (cshim_pool.out / f"{name}.go").touch()
    cshim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
    wait_for(lambda: not cshim_pool.regions_now(), DEADLINE_S, "the region deleted")


def test_a_running_container_job_is_resized_in_place_through_its_mounted_region(
    cshim_pool: ShimPool, glibc_image: str, cnatives: Natives
) -> None:
    name = "cresized"
    natives = str(cnatives.probe.parent)
    out = str(cshim_pool.out)
    job_id = cshim_pool.probe_job(
        name,
        ["init", f"alloc {4 * GIB}", "alloc 1"],
        later=("alloc 1", "info"),
        isolation="shim",
        resources={"gpus": "0.25", "gpu_memory": "4GiB"},
        container={"image": glibc_image, "mounts": [f"{natives}:{natives}:ro", f"{out}:{out}"]},
    )
    answers = cshim_pool.answers(name, 3)
    assert answers[2] == ["err", "2"]  # the slice is full
    wait_for(lambda: cshim_pool.job(job_id)["isolation"] == "shim", DEADLINE_S, "shimmed")
    cshim_pool.post(f"/v1/jobs/{job_id}/resize", {"gpu_memory": "6GiB", "gpus": "0.5"})
    (region_path,) = cshim_pool.regions_now()
    with Region.open(region_path, build=cnatives.shim) as region:
        wait_for(
            lambda: region.read().devices[0].mem_limit_bytes == 6 * GIB,
            DEADLINE_S,
            "the agent resizing the region",
        )
    (cshim_pool.out / f"{name}.next").touch()
    answers = cshim_pool.answers(name, 5)
    assert answers[3][0] == "ok", answers  # the process in the container may allocate again
    assert answers[4][2] == str(6 * GIB)  # and sees the new slice
    (cshim_pool.out / f"{name}.go").touch()
    cshim_pool.wait_state(job_id, "COMPLETED", timeout=DEADLINE_S)
