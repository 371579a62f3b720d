"""Usage slots (issue 25, finding 5): a process claims its slot at its first CUDA use, not when
the façade loads, so processes that only load it (tools, imports, children that never touch
the GPU) neither hold slots nor count as attached; slots of processes that are gone are reaped;
a replica may have far more than 128 processes using CUDA at once."""

from __future__ import annotations

from gpupool.runtime.shim import MAX_SLOTS
from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Probe, wait_for

LOADERS = 140  # more than the old 128 slots


def loaders(natives, region, probes, n):  # type: ignore[no-untyped-def]
    """n processes that load the façade and resolve every entry point, then wait."""
    env = shim_env(natives, region)
    started = [Probe(natives.probe, env) for _ in range(n)]
    probes.extend(started)
    for p in started:
        assert p.do("pid")[1] == str(p.pid)  # loaded and answering, no CUDA used
    return started


def test_processes_that_only_load_the_facade_take_no_slot(natives, make_region, probes):
    region = make_region(limit=64 * MIB)
    loaders(natives, region, probes, LOADERS)
    user = Probe(natives.probe, shim_env(natives, region))
    probes.append(user)
    user.ok("init")
    user.ok(f"alloc {MIB}")  # the 141st process allocates
    assert region.read().attached_pids == (user.pid,)
    assert region.read().devices[0].used_bytes == MIB


def test_more_than_128_processes_use_cuda_at_once_and_the_gone_are_reaped(natives, make_region,
                                                                          probes):  # fmt: skip
    assert MAX_SLOTS >= 1024
    region = make_region(limit=1024 * MIB)
    users = loaders(natives, region, probes, LOADERS)
    for p in users:
        p.ok("init")
        p.ok(f"alloc {MIB}")
    snap = region.read()
    assert len(snap.attached_pids) == LOADERS
    assert snap.devices[0].used_bytes == LOADERS * MIB
    for p in users[:40]:
        p.proc.kill()
        p.proc.wait()
    wait_for(lambda: region.reap() >= 0 and len(region.read().attached_pids) == LOADERS - 40,
             "the killed processes' slots reaped")  # fmt: skip
    assert region.read().devices[0].used_bytes == (LOADERS - 40) * MIB
    for p in users[40:]:
        p.close()
