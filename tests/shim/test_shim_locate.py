"""The build and the agent find the real driver as the loader would, and a call to a name the
real driver lacks says so (issue 25, finding 8).

The façade's forwarded names are its list joined with the real driver's exports; found only at
four fixed paths, a node whose driver sits on ``LD_LIBRARY_PATH``, in the loader's cache or in
the container toolkit's folders got a façade without the driver's newer names. A forwarded name
the real driver lacks used to return an error code silently."""

from __future__ import annotations

import pytest

from gpupool.shim import build, locate
from tests.shim.conftest import shim_env
from tests.shim.helpers import Probe


@pytest.fixture
def no_hints(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("GPUPOOL_REAL_LIBCUDA", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    locate._ldconfig.cache_clear()
    return monkeypatch


def test_the_build_finds_the_driver_on_the_library_path(natives, no_hints):
    no_hints.setenv("LD_LIBRARY_PATH", f"/nonexistent:{natives.fake.parent}")
    assert build._find_driver() == natives.fake.resolve()


def test_the_build_finds_the_driver_in_the_loaders_cache(natives, no_hints, tmp_path):
    fake_ldconfig = tmp_path / "bin" / "ldconfig"
    fake_ldconfig.parent.mkdir()
    fake_ldconfig.write_text(
        "#!/bin/sh\necho '1 libs found in cache'\n"
        f"echo '\tlibcuda.so.1 (libc6,x86-64) => {natives.fake}'\n"
    )
    fake_ldconfig.chmod(0o755)
    no_hints.setenv("PATH", f"{fake_ldconfig.parent}:/usr/bin:/bin")
    assert build._find_driver() == natives.fake.resolve()


def test_the_facade_is_never_taken_for_the_driver(natives, no_hints):
    no_hints.setenv("LD_LIBRARY_PATH", str(natives.shim.facade_dir))
    assert build._find_driver() != (natives.shim.facade_dir / "libcuda.so.1").resolve()


def test_a_forwarded_name_the_driver_lacks_fails_loudly(natives, make_region, probes):
    exported = set(build.elf_dynamic_names(natives.fake))
    lacking = sorted(set(build.forwarded_names(None)) - exported)
    assert lacking, "every forwarded name is in the fake: pick another"
    name = lacking[0]
    p = Probe(natives.probe, shim_env(natives, make_region()))
    probes.append(p)
    assert p.ok(f"callsym {name}") == ["500"]  # CUDA_ERROR_NOT_FOUND
    assert p.ok(f"callsym {name}") == ["500"]
    err = p.stderr()
    assert err.count(f"gpupool: {name} is not in the real CUDA driver ({natives.fake})") == 1, err
