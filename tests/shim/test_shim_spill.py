"""Defined oversubscription: an allocation that fits the slice but not the GPU's free memory
fails (spill off) or is served from managed memory preferring the device, counted apart."""

from __future__ import annotations

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Probe, fake_uuid

OOM = 2
GPU0 = fake_uuid(0)
PHYSICAL = 8 * MIB


def test_an_allocation_over_physical_memory_spills_where_opted_in(natives, make_region, probes):
    region = make_region(limit=32 * MIB, spill=True)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_MEM=str(PHYSICAL)))
    probes.append(p)
    p.ok("init")
    p.ok(f"alloc {6 * MIB}")  # on the device
    spilled = p.ok(f"alloc {6 * MIB}")[0]  # the device has 2 MiB left: served from managed
    usage = region.read().device(GPU0)
    assert (usage.used_bytes, usage.spilled_bytes) == (12 * MIB, 6 * MIB)
    assert usage.spill
    assert p.ok("info") == [str(20 * MIB), str(32 * MIB)]  # the slice, not the GPU
    assert p.err(f"alloc {20 * MIB + 1}") == OOM  # the slice still holds
    p.ok(f"free {spilled}")
    usage = region.read().device(GPU0)
    assert (usage.used_bytes, usage.spilled_bytes) == (6 * MIB, 0)


def test_without_spill_a_full_gpu_refuses_and_says_why(natives, make_region, probes):
    region = make_region(limit=32 * MIB)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_MEM=str(PHYSICAL)))
    probes.append(p)
    p.ok("init")
    assert p.ok("info") == [str(PHYSICAL), str(PHYSICAL)]  # never more than the GPU has
    p.ok(f"alloc {6 * MIB}")
    assert p.err(f"alloc {6 * MIB}") == OOM
    usage = region.read().device(GPU0)
    assert (usage.used_bytes, usage.spilled_bytes) == (6 * MIB, 0)
    assert "the GPU itself is full (spill to host is off)" in p.stderr()


def test_spill_can_be_turned_on_for_a_running_job(natives, make_region, probes):
    region = make_region(limit=32 * MIB)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_MEM=str(PHYSICAL)))
    probes.append(p)
    p.ok("init")
    p.ok(f"alloc {6 * MIB}")
    assert p.err(f"alloc {6 * MIB}") == OOM
    region.set_spill(GPU0, True)
    p.ok(f"alloc {6 * MIB}")
    assert region.read().device(GPU0).spilled_bytes == 6 * MIB


def test_a_pitched_allocation_over_physical_memory_spills_with_a_valid_pitch(
    natives, make_region, probes
):
    region = make_region(limit=32 * MIB, spill=True)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_MEM=str(PHYSICAL)))
    probes.append(p)
    p.ok("init")
    p.ok(f"alloc {6 * MIB}")  # the device has 2 MiB left
    ptr, pitch = p.ok("pitch 1000 4096")  # 1024 x 4096 = 4 MiB: spilled
    assert int(pitch) == 1024  # rows padded to 512 bytes, as the fake pads its own
    usage = region.read().device(GPU0)
    assert (usage.used_bytes, usage.spilled_bytes) == (10 * MIB, 4 * MIB)
    p.ok(f"free {ptr}")
    usage = region.read().device(GPU0)
    assert (usage.used_bytes, usage.spilled_bytes) == (6 * MIB, 0)


def test_without_spill_a_pitched_allocation_on_a_full_gpu_says_why(natives, make_region, probes):
    region = make_region(limit=32 * MIB)
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_MEM=str(PHYSICAL)))
    probes.append(p)
    p.ok("init")
    p.ok(f"alloc {6 * MIB}")
    assert p.err("pitch 1000 4096") == OOM
    assert region.read().device(GPU0).used_bytes == 6 * MIB
    assert "the GPU itself is full (spill to host is off)" in p.stderr()
