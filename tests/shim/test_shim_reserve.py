"""The context reserve: the agent measures what a process's first context takes (here the fake
driver's ``FAKE_CUDA_CTX_BYTES``), keeps it per model and driver version, writes it into every
region, and the shim charges it, so a slice's reachable bytes are ``limit - reserve``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpupool.runtime import shimreserve
from gpupool.runtime.isolation import SliceContext, SliceDevice, isolation_env
from gpupool.runtime.shim import Region, ShimIsolation
from gpupool.runtime.shimreserve import ESTIMATE_BYTES, ShimReserves
from tests.shim.conftest import MIB
from tests.shim.helpers import Probe, fake_uuid

OOM = 2
CTX = 300 * MIB + 4096  # the fake's context cost: not a round figure


@pytest.fixture
def node(natives, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(tmp_path / "regions"))
    monkeypatch.setenv("FAKE_CUDA_CTX_BYTES", str(CTX))
    monkeypatch.setenv("FAKE_CUDA_MEM", str(8 << 30))
    return natives


def test_the_measured_reserve_is_what_the_drivers_first_context_takes(node, tmp_path):
    cache = tmp_path / "state" / "shim-context.json"
    uuids = [fake_uuid(0), fake_uuid(1)]
    assert ShimReserves(cache, node.fake).for_devices(uuids) == dict.fromkeys(uuids, CTX)
    # One entry per model and driver version, kept for the next start.
    assert json.loads(cache.read_text()) == {"Fake GPU 0 / driver 12080": CTX,
                                             "Fake GPU 1 / driver 12080": CTX}  # fmt: skip


def test_a_cached_reserve_is_read_not_measured_again(node, tmp_path, monkeypatch):
    cache = tmp_path / "shim-context.json"
    cache.write_text(json.dumps({"Fake GPU 0 / driver 12080": 12345}))

    def no_measuring(*a: object, **k: object) -> int:
        raise AssertionError("measured although the figure was cached")

    monkeypatch.setattr(shimreserve, "measure", no_measuring)
    assert ShimReserves(cache, node.fake).for_devices([fake_uuid(0)]) == {fake_uuid(0): 12345}


def test_a_failed_measurement_uses_the_estimate_and_caches_nothing(node, tmp_path, caplog):
    cache = tmp_path / "shim-context.json"
    broken = tmp_path / "libcuda.so.1"
    broken.write_text("not a library")
    got = ShimReserves(cache, broken).for_devices([fake_uuid(0)])
    assert got == {fake_uuid(0): ESTIMATE_BYTES}
    assert not cache.exists()
    assert "512 MiB is assumed" in caplog.text


def test_the_reserve_is_the_measuring_processs_own_use_not_total_minus_free(
    node, tmp_path, monkeypatch
):
    """Issue 25, finding 6: total - free counted whatever else held memory on the GPU at agent
    start; NVML's figure for the measuring process is its context alone."""
    monkeypatch.setenv("FAKE_CUDA_OTHER_BYTES", str(1 << 30))  # another process's 1 GiB
    monkeypatch.setenv("GPUPOOL_REAL_LIBNVML", str(node.fake_nvml))
    got = ShimReserves(tmp_path / "c.json", node.fake).for_devices([fake_uuid(0)])
    assert got == {fake_uuid(0): CTX}


def test_a_device_busy_with_other_memory_is_not_taken_for_a_context(node, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_CTX_BYTES", str(4 << 30))  # half the fake GPU
    got = ShimReserves(tmp_path / "c.json", node.fake).for_devices([fake_uuid(0)])
    assert got == {fake_uuid(0): ESTIMATE_BYTES}


def test_a_slice_reaches_its_limit_less_the_reserve(node, tmp_path, probes):
    reserve = ShimReserves(tmp_path / "c.json", node.fake).for_devices([fake_uuid(0)])
    ctx = SliceContext(devices=(SliceDevice(fake_uuid(0), 8192),), milli=500, memory_mib=1024,
                       shim_reserve_bytes=reserve)  # fmt: skip
    env = dict(isolation_env("shim", ctx))
    with Region.open(Path(env["GPUPOOL_CUDA_REGION"]), build=node.shim) as region:
        assert region.read().device(fake_uuid(0)).context_reserve_bytes == CTX
    p = Probe(node.probe, {"PATH": os.environ["PATH"], **env})
    probes.append(p)
    p.ok("init")
    free, total = (int(x) for x in p.ok("info"))
    assert (free, total) == (1024 * MIB - CTX, 1024 * MIB)
    p.ok(f"alloc {1024 * MIB - CTX}")  # reachable: limit - reserve, to the byte
    assert p.err("alloc 1") == OOM
    p.ok("exit")
    p.proc.wait()
    ShimIsolation.release(env)
