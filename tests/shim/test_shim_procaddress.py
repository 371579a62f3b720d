"""``cuGetProcAddress`` hands out the right hook or none (issue 25, finding 2).

A real driver may answer ``cuGetProcAddress`` with internal pointers, not its exported symbols,
so the shim cannot always match the answer to a hook by pointer; the fake does the same with
``FAKE_CUDA_INTERNAL_PTRS=1``. Then the flags decide first (a per-thread request gets the
``_ptsz`` hook), a known variant is hooked only once the driver confirms it, and a variant the
shim does not know (the fake's ``cuGraphAddNode_v4`` for a future CUDA) goes out unhooked,
logged once, never as a hook of another signature.
"""

from __future__ import annotations

import pytest

from tests.shim.conftest import MIB, shim_env
from tests.shim.helpers import Probe


def probe(natives, region, probes, mode="default"):  # type: ignore[no-untyped-def]
    p = Probe(natives.probe, shim_env(natives, region, FAKE_CUDA_INTERNAL_PTRS="1"), mode)
    probes.append(p)
    p.ok("init")
    return p


@pytest.mark.parametrize(("mode", "hook"), [("ptsz", "cuLaunchKernel_ptsz"),
                                            ("default", "cuLaunchKernel")])  # fmt: skip
def test_the_flags_pick_the_stream_flavour_of_the_hook(natives, make_region, probes, mode, hook):
    p = probe(natives, make_region(share=300), probes, mode)
    where, name = p.ok("whois cuLaunchKernel")
    assert where.startswith(str(natives.shim.facade_dir)), where
    assert name == hook


def test_a_cuda_13_4_graph_add_node_gets_its_own_hook(natives, make_region, probes):
    p = probe(natives, make_region(limit=64 * MIB), probes)
    where, name = p.ok("whoisv cuGraphAddNode 13050")
    assert (where.startswith(str(natives.shim.facade_dir)), name) == (True, "cuGraphAddNode_v3")
    # Called with _v3's six arguments, the hook sees the mem-alloc node and holds the slice.
    p.ok(f"graphaddnode3 {16 * MIB}")
    assert p.err(f"graphaddnode3 {128 * MIB}") == 2


def test_a_variant_the_shim_does_not_know_goes_out_unhooked_and_logged_once(
    natives, make_region, probes
):
    p = probe(natives, make_region(), probes)
    for _ in range(3):
        where, _name = p.ok("whoisv cuGraphAddNode 14000")
        assert where == str(natives.fake), where  # the driver's own pointer
    err = p.stderr()
    assert err.count("a variant other than cuGraphAddNode_v3") == 1, err
