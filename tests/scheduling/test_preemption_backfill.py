"""Preemption, reservations, backfill and start estimates, from the user's side."""

from __future__ import annotations

from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingReason, PreemptionReason
from gpupool.scheduling.scheduler import schedule
from tests.scheduling.builders import SnapshotBuilder

NOW = 10_000.0


def full_node(b: SnapshotBuilder, node: str = "n1", gpus: int = 4, **run) -> SnapshotBuilder:  # type: ignore[no-untyped-def]
    b.node(node, gpus=gpus)
    for i in range(gpus):
        b.run(f"{node}-r{i}", node=node, devices=[i], **run)
    return b


# ----------------------------------------------------------------------------- preemption


def test_team_a_reclaims_its_guaranteed_half_gpu_from_team_b_who_borrows():
    # Team A is guaranteed half a GPU; team B borrowed the whole (only) GPU.
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=1)
        .quota("team-a", guaranteed=500, limit=1000)
        .quota("team-b", guaranteed=0, limit=1000)
        .run("b1", node="n1", milli=500, tenant="team-b", preemptible=True, start=1000)
        .run("b2", node="n1", milli=500, tenant="team-b", preemptible=True, start=2000)
        .job("a1", gpus=0.5, tenant="team-a")
        .build()
    )
    d = schedule(snap)
    assert d.start_of("a1") is None
    assert d.pending["a1"].reason is PendingReason.WAITING_FOR_PREEMPTION
    (p,) = d.preemptions
    assert p.for_job == "a1"
    assert p.reason is PreemptionReason.RECLAIM
    assert p.victim == "b2"  # the cheapest: started last, least work lost
    assert d.pending["a1"].estimated_start == NOW + 30.0  # after the victim's grace period


def test_a_borrowing_job_never_preempts():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=1)
        .quota("team-a", guaranteed=0, limit=1000)
        .run("low", node="n1", milli=1000, tenant="team-b", preemptible=True, priority=100)
        .job("a1", gpus=1, tenant="team-a", preemptible=True, priority=900)
        .build()
    )
    d = schedule(snap)
    assert d.preemptions == ()


def test_a_high_priority_job_preempts_a_low_priority_preemptible_job():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=1)
        .run("low", node="n1", priority=100, preemptible=True)
        .job("urgent", priority=900)
        .build()
    )
    d = schedule(snap)
    (p,) = d.preemptions
    assert (p.victim, p.for_job, p.reason) == ("low", "urgent", PreemptionReason.PRIORITY)
    assert "outranks" in p.message


def test_non_preemptible_equal_priority_and_fresh_jobs_are_never_victims():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=3)
        .run("pinned", node="n1", devices=[0], priority=100, preemptible=False)
        .run("peer", node="n1", devices=[1], priority=900, preemptible=True)
        .run("fresh", node="n1", devices=[2], priority=100, preemptible=True, start=NOW - 10)
        .job("urgent", priority=900)
        .build()
    )
    d = schedule(snap)
    assert d.preemptions == ()
    assert d.pending["urgent"].reason is PendingReason.INSUFFICIENT_GPU
    # Once the fresh job has run past the exemption it may be preempted.
    later = schedule(snap, SchedulerConfig(preempt_exempt_s=5))
    assert [p.victim for p in later.preemptions] == ["fresh"]


def test_the_victim_set_is_the_smallest_that_works():
    # n1: one 2-GPU job; n2: two 1-GPU jobs. A 2-GPU job should stop one job, not two.
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=2)
        .node("n2", gpus=2)
        .run("big", node="n1", devices=[0, 1], priority=100, preemptible=True)
        .run("s1", node="n2", devices=[0], priority=100, preemptible=True)
        .run("s2", node="n2", devices=[1], priority=100, preemptible=True)
        .job("j", gpus=2, priority=900)
        .build()
    )
    d = schedule(snap)
    assert [p.victim for p in d.preemptions] == ["big"]


def test_lower_priority_and_less_lost_work_are_preempted_first():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=3)
        .run("mid", node="n1", devices=[0], priority=300, preemptible=True, start=9000)
        .run("low-long", node="n1", devices=[1], priority=100, preemptible=True, start=0)
        .run(
            "low-ckpt",
            node="n1",
            devices=[2],
            priority=100,
            preemptible=True,
            start=0,
            checkpoint=NOW - 60,
        )
        .job("j", gpus=1, priority=900)
        .build()
    )
    d = schedule(snap)
    assert [p.victim for p in d.preemptions] == ["low-ckpt"]


def test_a_gang_victim_is_stopped_whole_and_a_gang_preemptor_gets_all_its_room():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=2)
        .node("n2", gpus=2)
        .run("gang", node="n1", devices=[0, 1], priority=100, preemptible=True, replica=0)
        .run("gang", node="n2", devices=[0, 1], priority=100, preemptible=True, replica=1)
        .job("g", gpus=2, replicas=2, priority=900)
        .build()
    )
    d = schedule(snap)
    assert [p.victim for p in d.preemptions] == ["gang"]
    assert d.pending["g"].reason is PendingReason.WAITING_FOR_PREEMPTION


def test_freed_room_is_kept_for_the_preemptor_and_not_handed_to_others():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=2)
        .run("low", node="n1", devices=[0, 1], priority=100, preemptible=True)
        .job("urgent", gpus=1, priority=900, submit=1)
        .job("other", gpus=0.5, priority=500, submit=2)  # another shape: no cached failure
        .build()
    )
    d = schedule(snap)
    assert [p.victim for p in d.preemptions] == ["low"]
    assert d.starts == ()  # "low" still runs until it has stopped


def test_a_job_whose_victims_are_stopping_waits_instead_of_preempting_again():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=2)
        .run("stopping", node="n1", devices=[0], priority=100, preemptible=True, preempted_for="j")
        .run("other", node="n1", devices=[1], priority=100, preemptible=True)
        .job("j", gpus=2, priority=900)
        .build()
    )
    d = schedule(snap)
    assert d.preemptions == ()
    assert d.pending["j"].reason is PendingReason.WAITING_FOR_PREEMPTION


def test_preemption_can_be_switched_off():
    snap = (
        SnapshotBuilder(now=NOW)
        .node("n1", gpus=1)
        .run("low", node="n1", priority=100, preemptible=True)
        .job("urgent", priority=900)
        .build()
    )
    assert schedule(snap, SchedulerConfig(preemption_enabled=False)).preemptions == ()
    assert schedule(snap, SchedulerConfig(preemption="none")).preemptions == ()


# ----------------------------------------------------------------------------- backfill


def test_the_first_blocked_job_is_reserved_and_a_short_job_backfills():
    # n1 runs until t=12000 on 2 of its 4 GPUs. "big" needs all 4: reserved at 12000.
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4)
    for i in range(2):
        b.run(f"r{i}", node="n1", devices=[i], expected_end=12_000)
    snap = (
        b.job("big", gpus=4, submit=1, expected=3600)
        .job("short", gpus=1, submit=2, expected=1000)
        .job("long", gpus=1, submit=3, expected=5000)
        .job("forever", gpus=1, submit=4)
        .build()
    )
    d = schedule(snap, SchedulerConfig(ordering="fifo"))
    (res,) = d.reservations
    assert (res.job_id, res.start_time, res.nodes) == ("big", 12_000, ("n1",))
    assert d.pending["big"].reason is PendingReason.INSUFFICIENT_GPU
    assert d.pending["big"].estimated_start == 12_000
    assert d.start_of("short") is not None  # ends at 11000, before the reservation
    assert d.pending["long"].reason is PendingReason.WAITING_FOR_RESERVATION
    assert d.pending["forever"].reason is PendingReason.WAITING_FOR_RESERVATION


def test_a_long_job_backfills_on_devices_the_reserved_job_does_not_need():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4).node("n2", gpus=4)
    for i in range(4):
        b.run(f"r{i}", node="n1", devices=[i], expected_end=12_000)
    b.run("x", node="n2", devices=[0], expected_end=20_000)
    snap = b.job("big", gpus=4, submit=1).job("long", gpus=1, submit=2).build()
    d = schedule(snap, SchedulerConfig(ordering="fifo"))
    (res,) = d.reservations
    assert res.nodes == ("n1",)
    start = d.start_of("long")
    assert start is not None
    assert start.replicas[0].node == "n2"


def test_strict_backfill_starts_nothing_behind_a_blocked_job():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4)
    b.run("r", node="n1", devices=[0, 1, 2], expected_end=12_000)
    snap = b.job("big", gpus=4, submit=1).job("short", gpus=1, submit=2, expected=10).build()
    d = schedule(snap, SchedulerConfig(ordering="fifo", backfill="strict"))
    assert d.starts == ()
    assert d.pending["short"].reason is PendingReason.PRIORITY


def test_greedy_backfill_starts_whatever_fits():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4)
    b.run("r", node="n1", devices=[0, 1, 2], expected_end=12_000)
    snap = b.job("big", gpus=4, submit=1).job("forever", gpus=1, submit=2).build()
    d = schedule(snap, SchedulerConfig(ordering="fifo", backfill="greedy"))
    assert d.reservations == ()
    assert d.start_of("forever") is not None


def test_every_blocked_job_gets_an_estimate_from_running_jobs_ends():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=2).node("n2", gpus=2)
    b.run("a", node="n1", devices=[0, 1], expected_end=11_000)
    b.run("b", node="n2", devices=[0, 1], expected_end=13_000)
    snap = (
        b.job("two", gpus=2, submit=1)  # reserved: fits at 11000
        .job("four", gpus=2, replicas=2, submit=2)  # fits at 13000
        .job("one", gpus=1, submit=3)  # fits at 11000
        .build()
    )
    d = schedule(snap, SchedulerConfig(ordering="fifo"))
    estimates = {k: v.estimated_start for k, v in d.pending.items()}
    assert estimates["two"] == 11_000
    assert estimates["four"] == 13_000
    assert estimates["one"] == 11_000


def test_unknown_ends_give_no_estimate():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=1).run("a", node="n1")
    d = schedule(b.job("j").build())
    assert d.pending["j"].estimated_start is None


def test_the_same_snapshot_gives_the_same_decision():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=4).node("n2", gpus=2)
    b.run("a", node="n1", devices=[0], priority=100, preemptible=True, expected_end=11_000)
    for i in range(12):
        b.job(f"j{i}", gpus=[0.25, 1, 2][i % 3], priority=[100, 500, 900][i % 3])
    snap = b.build()
    assert schedule(snap) == schedule(snap)
