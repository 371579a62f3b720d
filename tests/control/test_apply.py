"""The decision applier's rules (control/machinery/apply.py), on a fake target with no store.

The store and the replay adapters are exercised by tests/control/test_loop*.py and tests/sim/;
here each rule is checked on its own: what refuses a start, which victims are left alone, the
order of the steps, what a stop carries, what counts as a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.control.machinery.apply import (
    Room,
    VictimState,
    apply_decision,
    changed_pending,
    device_needs,
)
from gpupool.control.machinery.snapshot import PendingRead
from gpupool.scheduling.decision import (
    Decision,
    PendingInfo,
    PendingReason,
    Preemption,
    PreemptionReason,
    ReplicaStart,
    Start,
)


@dataclass
class FakeTarget:
    pending: set[str] = field(default_factory=set)
    room: dict[str, Room] = field(default_factory=dict)
    victims: dict[str, VictimState] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def still_pending(self, start: Start) -> bool:
        return start.job_id in self.pending

    def free_room(self, uuids: Iterable[str]) -> Mapping[str, Room]:
        return {u: self.room[u] for u in uuids if u in self.room}

    def start(self, start: Start) -> None:
        self.calls.append(("start", start.job_id))

    def victim_state(self, job_id: str) -> VictimState:
        return self.victims.get(job_id, VictimState.STOPPING)

    def stop(self, preemption: Preemption, *, at_once: bool, reason: str) -> None:
        how = "at once" if at_once else "with grace"
        self.calls.append(("stop", preemption.victim, preemption.for_job, how, reason))

    def note_pending(self, pending: Mapping[str, PendingInfo]) -> None:
        self.calls.append(("pending", *sorted(pending)))


def _start(job_id: str, *devices: str, milli: int = 1000, mem: int = 1024) -> Start:
    replica = ReplicaStart(0, "n1", devices, milli, mem, 1000, 1024)
    return Start(job_id, "t", "default", (replica,))


def _preempt(victim: str, for_job: str = "high") -> Preemption:
    return Preemption(victim, for_job, PreemptionReason.PRIORITY, "a job of priority 900 needs it")


FREE = Room(1000, 81920)


def test_starts_come_first_then_stops_then_pending_reasons() -> None:
    target = FakeTarget({"a"}, {"g0": FREE}, {"v": VictimState.RUNNING})
    waiting = {"high": PendingInfo(PendingReason.WAITING_FOR_PREEMPTION, "victims are stopping")}
    decision = Decision(starts=(_start("a", "g0"),), preemptions=(_preempt("v"),), pending=waiting)
    applied = apply_decision(decision, target)
    assert [c[0] for c in target.calls] == ["start", "stop", "pending"]
    assert (applied.started, applied.skipped, applied.preempted) == (("a",), (), ("v",))
    assert applied.changed


def test_a_start_whose_job_changed_since_the_snapshot_is_refused() -> None:
    target = FakeTarget(set(), {"g0": FREE})
    applied = apply_decision(Decision(starts=(_start("a", "g0"),)), target)
    assert (applied.started, applied.skipped) == ((), ("a",))
    assert target.calls == [("pending",)]
    assert not applied.changed


def test_a_start_whose_room_went_is_refused_and_the_next_one_still_starts() -> None:
    target = FakeTarget(
        {"a", "b", "c", "d"},
        {"g0": Room(500, 81920), "g1": Room(1000, 512), "g2": FREE},
    )
    starts = (
        _start("a", "g0"),  # milli gone
        _start("b", "g1"),  # memory gone
        _start("c", "g9"),  # the device is gone
        _start("d", "g2"),
    )
    applied = apply_decision(Decision(starts=starts), target)
    assert (applied.started, applied.skipped) == (("d",), ("a", "b", "c"))


def test_a_device_shared_by_two_replicas_of_a_job_needs_room_for_both() -> None:
    twice = Start(
        "a",
        "t",
        "default",
        (
            ReplicaStart(0, "n1", ("g0",), 500, 1024, 1000, 1024),
            ReplicaStart(1, "n1", ("g0",), 500, 1024, 1000, 1024),
        ),
    )
    assert device_needs(twice) == {"g0": Room(1000, 2048)}
    half = FakeTarget({"a"}, {"g0": Room(999, 81920)})
    assert apply_decision(Decision(starts=(twice,)), half).skipped == ("a",)


def test_a_victim_already_stopping_is_not_stopped_again() -> None:
    target = FakeTarget(victims={"v": VictimState.STOPPING})
    applied = apply_decision(Decision(preemptions=(_preempt("v"),)), target)
    assert applied.preempted == ()
    assert not applied.changed
    assert target.calls == [("pending",)]


def test_a_stop_keeps_the_preemptor_and_a_victim_not_yet_running_stops_at_once() -> None:
    target = FakeTarget(victims={"v": VictimState.RUNNING, "w": VictimState.STARTING})
    decision = Decision(preemptions=(_preempt("v", "h1"), _preempt("w", "h2")))
    assert apply_decision(decision, target).preempted == ("v", "w")
    assert target.calls[:2] == [
        ("stop", "v", "h1", "with grace", "preempted for job h1: a job of priority 900 needs it"),
        ("stop", "w", "h2", "at once", "preempted for job h2: a job of priority 900 needs it"),
    ]


def test_only_reasons_or_estimates_that_changed_since_the_snapshot_are_rewritten() -> None:
    same = PendingInfo(PendingReason.INSUFFICIENT_GPU, "no room", 100.0)
    moved = PendingInfo(PendingReason.INSUFFICIENT_GPU, "no room", 200.0)
    other = PendingInfo(PendingReason.PRIORITY, "behind a")
    reads = {
        "a": PendingRead(1, "InsufficientGpu: no room", 100.0),
        "b": PendingRead(2, "InsufficientGpu: no room", 100.0),
        "c": PendingRead(3, "InsufficientGpu: no room", None),
    }
    out = changed_pending({"a": same, "b": moved, "c": other, "gone": other}, reads)
    assert out == [
        ("b", reads["b"], "InsufficientGpu: no room", 200.0),
        ("c", reads["c"], "Priority: behind a", None),
    ]
