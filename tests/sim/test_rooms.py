"""The ``static`` scenario's rooms: sizes by guarantee, whole machines first."""

from __future__ import annotations

from collections import Counter

from gpupool.domain.tenants import Quota
from gpupool.sim.rooms import room_sizes, static_rooms
from gpupool.sim.workload import TraceJob, Workload, uniform_cluster


def test_sizes_follow_weights_and_add_up_to_the_cluster() -> None:
    assert room_sizes({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert room_sizes({"a": 3, "b": 1}, 8) == {"a": 6, "b": 2}
    assert room_sizes({"a": 0, "b": 0}, 5) == {"a": 3, "b": 2}  # no weights: equal parts


def test_a_room_holds_whole_machines_before_the_remainders() -> None:
    jobs = tuple(TraceJob(f"j{t}", t, 0.0, 60.0, 1000) for t in ("a", "b", "c"))
    quotas = (
        Quota("a", "default", guaranteed_milli=17_000),
        Quota("b", "default", guaranteed_milli=17_000),
        Quota("c", "default", guaranteed_milli=6_000),
    )
    cluster = uniform_cluster(40, "A100", 8)  # 5 machines of 8
    rooms = static_rooms(Workload("w", jobs, quotas=quotas), cluster)
    assert rooms.gpus == {"a": 17, "b": 17, "c": 6}
    per_machine: dict[str, Counter[str]] = {}
    for d in rooms.devices:
        per_machine.setdefault(d.pool, Counter())[d.node] += 1
    # a and b each own two whole machines (a 16-GPU gang fits), plus one GPU of the fifth
    for room in (rooms.pool_of["a"], rooms.pool_of["b"]):
        assert sorted(per_machine[room].values()) == [1, 8, 8]
    assert sum(per_machine[rooms.pool_of["c"]].values()) == 6
    assert len(rooms.devices) == 40
