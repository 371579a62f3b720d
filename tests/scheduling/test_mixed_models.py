"""Nodes that mix GPU models (issue 17 item 1): every healthy GPU of every model is placeable,
a request's allowed models are checked per device, and one replica's GPUs are of one model."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduling.capacity import build_capacity
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.scheduling.builders import SnapshotBuilder

MIB = {"A100-80GB": 81920, "T4": 15360, "H100-80GB": 81559}


def mixed(builder: SnapshotBuilder, node: str, models: list[str]) -> ClusterSnapshot:
    """``builder``'s snapshot with ``node``'s devices given ``models`` in index order."""
    snap = builder.build()
    devices = [
        replace(d, model=models[d.index], memory_mib=MIB[models[d.index]]) if d.node == node else d
        for d in snap.devices
    ]
    return replace(snap, devices=tuple(devices))


def _models(snap: ClusterSnapshot, device_uuids: tuple[str, ...]) -> list[str]:
    by_uuid = {d.uuid: d.model for d in snap.devices}
    return [by_uuid[u] for u in device_uuids]


def _readme_node() -> SnapshotBuilder:
    return SnapshotBuilder().node("n1", gpus=4, cpus=64)


README = ["A100-80GB", "A100-80GB", "T4", "T4"]


def test_every_device_of_a_mixed_node_is_usable_with_its_own_model() -> None:
    cap = build_capacity(mixed(_readme_node(), "n1", README))
    a = cap.arrays
    assert a.usable.tolist() == [[True, True, True, True]]
    assert [a.model_names[m] for m in a.slot_model[0]] == README
    assert a.mixed_rows.tolist() == [0]


def test_a_t4_job_on_an_a100_and_t4_node_goes_to_a_t4() -> None:
    snap = mixed(_readme_node().job("t4", gpus=1, gpu_types=["T4"]), "n1", README)
    decision = schedule(snap)
    [start] = decision.starts
    assert _models(snap, start.replicas[0].devices) == ["T4"]
    assert start.replicas[0].memory_per_device_mib == MIB["T4"]


def test_four_whole_gpu_jobs_fill_the_four_cards_of_a_mixed_node() -> None:
    b = _readme_node()
    for i in range(4):
        b.job(f"w{i}", gpus=1)
    snap = mixed(b, "n1", README)
    decision = schedule(snap)
    assert len(decision.starts) == 4, decision.pending
    placed = sorted(m for s in decision.starts for m in _models(snap, s.replicas[0].devices))
    assert placed == sorted(README)
    for s in decision.starts:  # whole cards: each replica promised its own card's memory
        [model] = _models(snap, s.replicas[0].devices)
        assert s.replicas[0].memory_per_device_mib == MIB[model]


def test_the_single_h100_of_a_t4_node_is_used() -> None:
    snap = mixed(
        SnapshotBuilder().node("n1", gpus=3).job("h", gpus=1, gpu_types=["H100"]),
        "n1",
        ["T4", "T4", "H100-80GB"],
    )
    [start] = schedule(snap).starts
    assert _models(snap, start.replicas[0].devices) == ["H100-80GB"]


def test_a_two_gpu_replica_takes_two_cards_of_one_model() -> None:
    b = _readme_node().job("p1", gpus=2).job("p2", gpus=2)
    snap = mixed(b, "n1", README)
    decision = schedule(snap)
    assert len(decision.starts) == 2
    for s in decision.starts:
        assert len(set(_models(snap, s.replicas[0].devices))) == 1


def test_three_gpus_of_one_model_on_a_two_plus_two_node_never_fit_and_say_so() -> None:
    snap = mixed(_readme_node().job("big", gpus=3), "n1", README)
    decision = schedule(snap)
    assert decision.starts == ()
    info = decision.pending["big"]
    assert info.reason is PendingReason.TOO_LARGE
    assert "2 GPUs of one model" in info.message


def test_a_model_the_node_has_only_as_its_minority_is_not_no_device_of_type() -> None:
    b = _readme_node().run("r", node="n1", devices=[2, 3], milli=1000)
    snap = mixed(b.job("t4", gpus=1, gpu_types=["T4"]), "n1", README)
    info = schedule(snap).pending["t4"]
    assert info.reason is PendingReason.INSUFFICIENT_GPU, info


@settings(max_examples=60, deadline=None)
@given(
    models=st.lists(st.sampled_from(sorted(MIB)), min_size=1, max_size=6),
    jobs=st.lists(
        st.tuples(st.sampled_from([0.25, 0.5, 1, 2, 3]), st.sampled_from([None, "T4", "A100"])),
        min_size=1,
        max_size=8,
    ),
)
def test_placements_on_mixed_nodes_respect_models_and_capacity(
    models: list[str], jobs: list[tuple[float, str | None]]
) -> None:
    b = SnapshotBuilder().node("n1", gpus=len(models), cpus=64)
    for i, (gpus, kind) in enumerate(jobs):
        b.job(f"j{i}", gpus=gpus, gpu_types=[kind] if kind else [])
    snap = mixed(b, "n1", models)
    decision = schedule(snap)
    by_uuid = {d.uuid: d for d in snap.devices}
    milli: dict[str, int] = {}
    mem: dict[str, int] = {}
    wanted = {f"j{i}": kind for i, (_, kind) in enumerate(jobs)}
    for s in decision.starts:
        for r in s.replicas:
            got = {by_uuid[u].model for u in r.devices}
            assert len(got) <= 1, got  # one model per replica
            kind = wanted[s.job_id]
            assert kind is None or all(kind in m for m in got)
            for u in r.devices:
                milli[u] = milli.get(u, 0) + r.milli_per_device
                mem[u] = mem.get(u, 0) + r.memory_per_device_mib
    for u, used in milli.items():
        assert used <= 1000
        assert mem[u] <= by_uuid[u].memory_mib
