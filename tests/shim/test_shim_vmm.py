"""VMM allocations and memory pools by location (issue 25, finding 7).

A VMM allocation (PyTorch's expandable segments, NCCL's cuMem buffers) lives while its handle is
unreleased *or* any mapping of it remains: the driver frees it only when both are gone, so the
shim uncharges it only then. A pool keeps its memory where its location says: a pool of host
memory takes nothing from the GPU, a pool on another device of the slice is that device's; and
a location type the shim does not know (CUDA 13.5's type 6) is counted, never left out. The
fake driver keeps a released-but-mapped allocation alive as a real one does.
"""

from __future__ import annotations

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Probe, fake_uuid

VA = 0x7F0000000000  # a virtual address range the probe maps at (the fake checks none)


def probe(natives, region, probes, **env):  # type: ignore[no-untyped-def]
    p = Probe(natives.probe, shim_env(natives, region, **env))
    probes.append(p)
    p.ok("init")
    return p


def used(region, device: int = 0) -> int:  # type: ignore[no-untyped-def]
    return region.read().device(fake_uuid(device)).used_bytes


def test_a_released_vmm_allocation_stays_charged_until_unmapped(natives, make_region, probes):
    region = make_region(limit=64 * MIB)
    p = probe(natives, region, probes)
    (handle,) = p.ok(f"vmm {32 * MIB} 0")
    p.ok(f"map {VA} {32 * MIB} {handle}")
    p.ok(f"release {handle}")
    assert used(region) == 32 * MIB  # still mapped: the driver still holds it
    assert p.err(f"vmm {40 * MIB} 0") == 2  # and the slice has no room for more
    p.ok(f"unmap {VA} {32 * MIB}")
    assert used(region) == 0
    p.ok(f"vmm {40 * MIB} 0")


def test_an_unmapped_release_uncharges_at_once(natives, make_region, probes):
    region = make_region(limit=64 * MIB)
    p = probe(natives, region, probes)
    (handle,) = p.ok(f"vmm {32 * MIB} 0")
    p.ok(f"release {handle}")
    assert used(region) == 0


def test_a_host_pool_takes_nothing_from_the_slice(natives, make_region, probes):
    region = make_region(limit=8 * MIB)
    p = probe(natives, region, probes)
    (pool,) = p.ok("poolcreate 2 0")  # CU_MEM_LOCATION_TYPE_HOST
    p.ok(f"poolalloc {pool} {32 * MIB}")  # more than the slice: host memory
    assert used(region) == 0


def test_a_pool_on_another_device_is_charged_there(natives, make_region, probes):
    region = make_region(limit=64 * MIB, devices=2)
    p = probe(natives, region, probes, FAKE_CUDA_DEVICES="2")  # current device: 0
    (pool,) = p.ok("poolcreate 1 1")  # a device pool on device 1
    p.ok(f"poolalloc {pool} {4 * MIB}")
    assert (used(region, 0), used(region, 1)) == (0, 4 * MIB)


def test_an_unknown_location_type_is_counted(natives, make_region, probes):
    region = make_region(limit=64 * MIB)
    p = probe(natives, region, probes)
    p.ok(f"vmm {16 * MIB} 0 6")  # CUDA 13.5's location type 6
    assert used(region) == 16 * MIB
    assert p.err(f"vmm {64 * MIB} 0 6") == 2
