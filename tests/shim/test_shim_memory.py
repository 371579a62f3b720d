"""A CUDA program under the shim: every allocation path counts against the slice, to the byte."""

from __future__ import annotations

import subprocess

import pytest

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Natives, Probe, fake_uuid

OOM = 2
LIMIT = 64 * MIB


def start(natives: Natives, region, probes, mode: str = "default", **env: str) -> Probe:  # type: ignore[no-untyped-def]
    p = Probe(natives.probe, shim_env(natives, region, **env), mode)
    probes.append(p)
    p.ok("init")
    return p


@pytest.mark.parametrize("mode", ["default", "ptsz", "dlsym"])
def test_runtime_lookup_gets_the_shim_and_cumemalloc_stops_at_the_limit(
    natives, make_region, probes, mode
):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes, mode)
    # The pointer a CUDA 12 runtime gets for cuMemAlloc is the shim's, not the driver's.
    where = p.ok("whois cuMemAlloc cuMemAlloc_v2")
    assert where[0] == str(natives.shim.facade_dir / "libcuda.so.1")
    assert where[1] == "cuMemAlloc_v2"
    if mode == "ptsz":
        assert p.ok("whois cuLaunchKernel")[1] == "cuLaunchKernel_ptsz"
        assert p.ok("whois cuMemAllocAsync")[1] == "cuMemAllocAsync_ptsz"
    a = p.ok(f"alloc {LIMIT - 1000}")[0]
    assert p.err("alloc 1001") == OOM
    p.ok("alloc 1000")
    assert region.read().device(fake_uuid(0)).used_bytes == LIMIT
    assert p.err("alloc 1") == OOM
    p.ok(f"free {a}")
    assert region.read().device(fake_uuid(0)).used_bytes == 1000
    p.ok(f"alloc {LIMIT - 1000}")
    err = p.stderr()
    lines = [line for line in err.splitlines() if "out of memory" in line]
    assert len(lines) == 2, err
    assert 'slice "job 7 replica 0" allows 67108864 bytes (64.0 MiB)' in lines[0]
    assert fake_uuid(0) in lines[0]


def test_every_allocation_path_counts_to_the_byte(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes)

    def used() -> int:
        return region.read().device(fake_uuid(0)).used_bytes

    # pitch: the fake pads rows to 512 bytes; the exact pitch * height is counted.
    ptr, pitch = p.ok("pitch 1000 10")
    assert int(pitch) == 1024
    assert used() == 10240
    p.ok(f"free {ptr}")
    assert used() == 0
    for cmd in ("managed", "alloc"):
        ptr = p.ok(f"{cmd} {LIMIT}")[0]
        assert used() == LIMIT, cmd
        assert p.err(f"{cmd} 1") == OOM
        p.ok(f"free {ptr}")
        assert used() == 0, cmd
    for cmd in ("async", "pool"):  # stream-ordered: what the pool holds counts (see below)
        ptr = p.ok(f"{cmd} {LIMIT}")[0]
        assert used() == LIMIT, cmd
        assert p.err(f"{cmd} 1") == OOM
        p.ok(f"freeasync {ptr}")
        p.ok("sync")  # the pool gives the memory back at a synchronisation
        big = p.ok(f"alloc {LIMIT}")[0]  # fits at once, though no pool call came since
        p.ok(f"free {big}")
        assert used() == 0, cmd
    h = p.ok(f"vmm {LIMIT - 7} 0")[0]
    assert used() == LIMIT - 7
    assert p.err("vmm 8 0") == OOM
    p.ok("vmm 7 0")
    p.ok(f"release {h}")
    assert used() == 7
    # arrays: the driver's own memory requirements (here rounded to 512) are counted.
    arr = p.ok("array 100 3")[0]  # float: 1200 bytes -> 1536
    assert used() == 7 + 1536
    arr3 = p.ok("array3d 10 10 10")[0]  # uchar4: 4000 -> 4096
    assert used() == 7 + 1536 + 4096
    p.ok(f"destroyarray {arr}")
    p.ok(f"destroyarray {arr3}")
    assert used() == 7
    assert p.err(f"array {LIMIT // 4} 1") == OOM
    assert used() == 7


def test_async_allocations_count_what_their_pool_holds(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes)

    def used() -> int:
        return region.read().device(fake_uuid(0)).used_bytes

    # The fake's pools grow in 2 MiB steps and keep what is freed until a synchronisation.
    a = p.ok("async 1000")[0]
    assert used() == 2 * MIB
    p.ok(f"freeasync {a}")
    assert used() == 2 * MIB  # still held by the pool
    b = p.ok(f"async {MIB}")[0]  # served from what the pool keeps: nothing new
    assert used() == 2 * MIB
    c = p.ok(f"pool {40 * MIB}")[0]
    assert used() == 42 * MIB
    p.ok(f"freeasync {c}")
    assert used() == 42 * MIB
    # The pool holds 42 MiB the job freed: the GPU really is that full, so the slice is too.
    assert p.err(f"alloc {LIMIT - 41 * MIB}") == OOM
    p.ok("sync")  # releases everything above what is in use (b: 1 MiB -> one 2 MiB step)
    p.ok(f"alloc {LIMIT - 2 * MIB}")
    assert used() == LIMIT
    p.ok(f"freeasync {b}")


def test_info_calls_report_the_slice(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes, FAKE_CUDA_MEM=str(1 << 30))
    assert p.ok("info") == [str(LIMIT), str(LIMIT)]
    assert p.ok("total 0") == [str(LIMIT)]
    p.ok(f"alloc {5 * MIB}")
    assert p.ok("info") == [str(LIMIT - 5 * MIB), str(LIMIT)]


def test_context_reserve_is_charged_once_per_process(natives, make_region, probes):
    region = make_region(limit=LIMIT, context_reserve_bytes=3 * MIB)
    p = start(natives, region, probes)  # init retains the primary context
    assert region.read().device(fake_uuid(0)).used_bytes == 3 * MIB
    p.ok("ctxcreate 0")
    assert region.read().device(fake_uuid(0)).used_bytes == 3 * MIB
    assert p.err(f"alloc {LIMIT - 3 * MIB + 1}") == OOM
    p.ok(f"alloc {LIMIT - 3 * MIB}")


def test_a_directly_linked_program_is_limited_and_its_other_calls_forwarded(natives, make_region):
    region = make_region(limit=LIMIT)
    env = shim_env(natives, region)

    def run(nbytes: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(natives.direct), str(nbytes)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    ok = run(LIMIT)
    assert ok.stdout.splitlines() == ["name Fake GPU 0", "version 12080", "alloc 0"], ok.stderr
    over = run(LIMIT + 1)
    assert over.stdout.splitlines()[-1] == f"alloc {OOM}"
    assert "out of memory" in over.stderr


def test_the_preload_fallback_limits_a_runtime_lookup(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = Probe(natives.probe, shim_env(natives, region, preload=True))
    probes.append(p)
    p.ok("init")
    assert p.ok("whois cuMemAlloc cuMemAlloc_v2")[0] == str(natives.shim.preload)
    p.ok(f"alloc {LIMIT}")
    assert p.err("alloc 1") == OOM


def test_a_bad_region_refuses_cuda_with_what_to_do(natives, tmp_path, probes):
    bad = tmp_path / "bad.region"
    bad.write_bytes(b"not a region" * 10000)
    env = {"GPUPOOL_CUDA_REGION": str(bad), "GPUPOOL_REAL_LIBCUDA": str(natives.fake),
           "LD_LIBRARY_PATH": str(natives.shim.facade_dir)}  # fmt: skip
    p = Probe(natives.probe, env)
    probes.append(p)
    assert p.err("init") == 3
    assert "not a gpupool region of this version" in p.stderr()
