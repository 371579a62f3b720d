from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.runtime.shim import DeviceSlice, Region, job_env
from gpupool.shim.build import ensure_built
from tests.shim.helpers import Natives, Probe, build_natives, fake_uuid

MIB = 1 << 20


@pytest.fixture(scope="session")
def natives(tmp_path_factory: pytest.TempPathFactory) -> Natives:
    if shutil.which("cc") is None:
        pytest.skip("the shim tests need a C compiler (cc)")
    # A fresh cache: the tests also check that a clean machine builds the shim.
    shim = ensure_built(cache=tmp_path_factory.mktemp("shim-cache"))
    return build_natives(tmp_path_factory.mktemp("natives"), shim)


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
