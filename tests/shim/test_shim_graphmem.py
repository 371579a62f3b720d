"""Graph memory and mipmapped arrays under the shim, to the byte on the fake driver.

A graph's mem-alloc nodes (``cuGraphAddMemAllocNode``, ``cuGraphAddNode`` with a mem-alloc node,
``cuMemAllocAsync`` under stream capture) take memory from the device's graph pool when the
driver maps it (the fake: at upload or launch), kept until ``cuDeviceGraphMemTrim``: the slice is
charged that pool's reserve, and a graph that cannot fit is refused before anything maps."""

from __future__ import annotations

import pytest

from tests.shim.conftest import MIB
from tests.shim.helpers import fake_uuid
from tests.shim.test_shim_memory import LIMIT, OOM, start

A = 40 * MIB + 123  # a graph's allocation: no round figure


def used(region) -> int:  # type: ignore[no-untyped-def]
    return region.read().device(fake_uuid(0)).used_bytes


@pytest.mark.parametrize("how", ["graphnode", "graphaddnode", "capture"])
def test_graph_memory_counts_from_its_mapping_until_a_trim(natives, make_region, probes, how):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes)
    graph = p.ok(f"{how} {A}")[0]
    assert used(region) == 0  # a node allocates nothing yet
    exec_ = p.ok(f"instantiate {graph}")[0]
    p.ok(f"upload {exec_}")
    assert used(region) == A  # the graph pool's reserve, to the byte
    p.ok(f"glaunch {exec_}")
    p.ok(f"glaunch {exec_}")  # served from the pool's reserve: nothing more
    assert used(region) == A
    p.ok(f"alloc {LIMIT - A}")
    assert p.err("alloc 1") == OOM  # the graph's memory is the slice's
    p.ok("trim")
    assert used(region) == LIMIT - A
    p.ok("alloc 1")


def test_a_graph_that_cannot_fit_is_refused_before_it_maps(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes)
    assert p.err(f"graphnode {LIMIT + 1}") == OOM  # can never fit: refused when added
    assert p.err(f"capture {LIMIT + 1}") == OOM
    graph = p.ok(f"graphnode {A}")[0]
    exec_ = p.ok(f"instantiate {graph}")[0]
    p.ok(f"glaunch {exec_}")
    p.ok("trim")
    assert used(region) == 0
    big = p.ok(f"alloc {LIMIT - A + 1}")[0]
    assert p.err(f"glaunch {exec_}") == OOM  # it would map A again: refused, nothing mapped
    assert p.err(f"upload {exec_}") == OOM
    assert used(region) == LIMIT - A + 1
    p.ok(f"free {big}")
    p.ok(f"glaunch {exec_}")
    assert used(region) == A
    p.ok(f"gexecdestroy {exec_}")
    err = p.stderr()
    lines = [line for line in err.splitlines() if "out of memory" in line]
    assert len(lines) == 4, err
    assert f"{LIMIT - A + 1} in use by its processes, {A} more asked" in lines[2]


def test_a_mipmapped_array_counts_the_drivers_size(natives, make_region, probes):
    region = make_region(limit=LIMIT)
    p = start(natives, region, probes)
    # 100x30 floats, 4 levels: 12000, 3000, 700 (25x7), 144 (12x3) bytes, each rounded up to
    # 512 by the fake driver: 12288 + 3072 + 1024 + 512.
    m = p.ok("mipmap 100 30 4")[0]
    assert used(region) == 12288 + 3072 + 1024 + 512
    p.ok(f"destroymipmap {m}")
    assert used(region) == 0
    assert p.err(f"mipmap {LIMIT // 4 + 1} 1 1") == OOM
