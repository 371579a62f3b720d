"""Context headroom when packing (issue 25, finding 6): a replica whose isolation keeps its CUDA
context outside its slice takes its GPU's context reserve beside the slice.

The card is an 80 GiB A100 (81,920 MiB). Its node reports a reserve of 1,000 MiB unless a test
says otherwise; a device whose agent reported none gets ``DEFAULT_CONTEXT_RESERVE_MIB``.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.domain.jobs import IsolationMode
from gpupool.domain.nodes import Device, Node
from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.layout import DEFAULT_CONTEXT_RESERVE_MIB
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder

RESERVE = 1000


def _snapshot(
    builder: SnapshotBuilder,
    *,
    modes: tuple[str, ...] | None = ("exclusive", "soft"),
    reserve: int | None = RESERVE,
    isolation: str = "soft",
) -> ClusterSnapshot:
    """``builder``'s snapshot with every node offering ``modes``, every device reporting
    ``reserve`` and every pending job asking for ``isolation``."""
    snap = builder.build()
    nodes = tuple(replace(n, isolation_modes=modes) for n in snap.nodes)
    devices = tuple(replace(d, context_reserve_mib=reserve) for d in snap.devices)
    mode = IsolationMode(isolation)
    pending = tuple(replace(j, spec=replace(j.spec, isolation=mode)) for j in snap.pending)
    return replace(snap, nodes=nodes, devices=devices, pending=pending)


def _quarters(memory: int | None = 20000) -> SnapshotBuilder:
    b = SnapshotBuilder().node("n1", gpus=1)
    for i in range(4):
        b.job(f"q{i}", gpus="0.25", memory=memory)
    return b


def _started(snap: ClusterSnapshot) -> dict[str, int]:
    """Job id -> the memory per device it was given, for the jobs the cycle starts."""
    return {s.job_id: s.replicas[0].memory_per_device_mib for s in schedule(snap).starts}


def test_soft_slices_keep_a_reserve_each_so_the_fourth_quarter_waits() -> None:
    decision = schedule(_snapshot(_quarters()))
    assert sorted(s.job_id for s in decision.starts) == ["q0", "q1", "q2"]
    waiting = decision.pending["q3"]
    assert waiting.reason is PendingReason.INSUFFICIENT_MEMORY
    assert "CUDA context" in waiting.message
    assert f"{RESERVE}MiB per replica" in waiting.message


def test_shim_slices_count_the_context_inside_so_all_four_start() -> None:
    assert len(_started(_snapshot(_quarters(), isolation="shim"))) == 4
    assert len(_started(_snapshot(_quarters(), isolation="mps+shim"))) == 4


def test_auto_keeps_headroom_only_where_the_node_would_not_pick_the_shim() -> None:
    assert len(_started(_snapshot(_quarters(), isolation="auto"))) == 3
    with_shim = ("exclusive", "shim", "soft")
    assert len(_started(_snapshot(_quarters(), isolation="auto", modes=with_shim))) == 4
    # A node that never registered modes (a simulated cluster) counts as offering the shim.
    assert len(_started(_snapshot(_quarters(), isolation="auto", modes=None))) == 4


def test_a_device_without_a_reported_reserve_gets_the_default() -> None:
    snap = _snapshot(_quarters(), reserve=None)
    cap = build_capacity(snap)
    assert cap.arrays.context_mem[0, 0] == DEFAULT_CONTEXT_RESERVE_MIB
    assert len(_started(snap)) == 3


def test_proportional_quarters_still_fill_the_card_with_the_context_inside_each_share() -> None:
    started = _started(_snapshot(_quarters(memory=None)))
    assert sorted(started) == ["q0", "q1", "q2", "q3"]
    assert set(started.values()) == {81920 // 4 - RESERVE}  # the share less the context


def test_whole_gpu_replicas_keep_no_headroom() -> None:
    b = SnapshotBuilder().node("n1", gpus=1).job("whole", gpus=1, memory=81920)
    assert _started(_snapshot(b)) == {"whole": 81920}


def test_a_running_soft_replica_holds_its_reserve_beside_its_slice() -> None:
    b = SnapshotBuilder().node("n1", gpus=1)
    b.run("r", node="n1", milli=250, memory=20000)
    snap = _snapshot(b)
    running = tuple(replace(r, isolation="soft") for r in snap.running)
    cap = build_capacity(replace(snap, running=running))
    assert cap.arrays.free_mem[0, 0] == 81920 - 20000 - RESERVE
    shimmed = tuple(replace(r, isolation="shim") for r in snap.running)
    assert build_capacity(replace(snap, running=shimmed)).arrays.free_mem[0, 0] == 81920 - 20000


def test_a_slice_too_big_for_the_card_with_its_context_says_so_even_when_empty() -> None:
    b = SnapshotBuilder().node("n1", gpus=1).job("big", gpus="0.5", memory=81920 - RESERVE // 2)
    waiting = schedule(_snapshot(b)).pending["big"]
    assert waiting.reason is PendingReason.TOO_LARGE
    assert "CUDA context" in waiting.message


def test_nodes_and_devices_built_without_the_new_fields_stay_comparable() -> None:
    # Old callers (the simulator's traces) build Node and Device positionally.
    assert Node("n", 1000, 1024).isolation_modes is None
    assert Device("u", "n", 0, "A100", 81920).context_reserve_mib is None


def test_preempting_a_soft_replica_gives_back_its_slice_and_its_headroom() -> None:
    # Three soft quarters run (3 x 21,000 MiB with their contexts: 18,920 MiB free). An urgent
    # soft half with 38,500 MiB needs 39,500 MiB with its context: one victim gives back 21,000
    # MiB (39,920 free), enough; had its headroom not come back (20,000: 38,920) it would take two.
    b = SnapshotBuilder(now=10_000.0).node("n1", gpus=1)
    for i in range(3):
        b.run(f"low{i}", node="n1", milli=250, memory=20000, priority=100, preemptible=True)
    b.job("urgent", gpus="0.5", memory=38500, priority=900)
    snap = _snapshot(b)
    snap = replace(snap, running=tuple(replace(r, isolation="soft") for r in snap.running))
    victims = {p.victim for p in schedule(snap).preemptions}
    assert len(victims) == 1, victims
