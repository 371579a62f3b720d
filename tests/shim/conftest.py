from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.runtime.shim import DeviceSlice, Region, job_env
from gpupool.shim.build import ensure_built
from tests.conftest import run_folder, run_lock
from tests.shim.helpers import Natives, Probe, build_natives, fake_uuid, natives_in

MIB = 1 << 20


@pytest.fixture(scope="session")
def natives(tmp_path_factory: pytest.TempPathFactory) -> Natives:
    """The shim and the test programs, built once per run for every xdist worker (a worker
    each built them before: a C build of several seconds of CPU per worker)."""
    if shutil.which("cc") is None:
        pytest.skip("the shim tests need a C compiler (cc)")
    shared = run_folder(tmp_path_factory) / "shim-natives"
    with run_lock(shared, "build"):
        # A fresh cache for the run: the tests also check that a clean machine builds the shim.
        shim = ensure_built(cache=shared / "shim-cache")
        done = shared / "natives.built"
        if done.exists():
            return natives_in(shared / "natives", shim)
        built = build_natives(shared / "natives", shim)
        done.touch()
        return built


@pytest.fixture
def make_region(tmp_path: Path, natives: Natives) -> Iterator:  # type: ignore[type-arg]
    regions: list[Region] = []

    def make(limit: int = 64 * MIB, share: int = 1000, devices: int = 1, **kw: object) -> Region:
        slices = [
            DeviceSlice(uuid=fake_uuid(i), mem_limit_bytes=limit, sm_share_permille=share,
                        **kw)  # type: ignore[arg-type]
            for i in range(devices)
        ]  # fmt: skip
        r = Region.create(tmp_path / f"cuda{len(regions)}.region", "job 7 replica 0", slices,
                          build=natives.shim)  # fmt: skip
        regions.append(r)
        return r

    yield make
    for r in regions:
        r.close()


def shim_env(
    natives: Natives, region: Region, *, preload: bool = False, **extra: str
) -> dict[str, str]:
    import os

    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env = job_env(region.path, natives.fake, real_nvml=natives.fake_nvml, build=natives.shim,
                  preload=preload, base=base)  # fmt: skip
    if preload:  # the program itself finds the fake as its libcuda.so.1
        env["LD_LIBRARY_PATH"] = str(natives.fake.parent)
    env.update(extra)
    return env


@pytest.fixture
def probes() -> Iterator[list[Probe]]:
    started: list[Probe] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
