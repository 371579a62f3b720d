"""Queue order and quotas, from the user's side."""

from __future__ import annotations

import pytest

from gpupool.domain.errors import InvalidValue
from gpupool.scheduling.config import OrderingWeights, SchedulerConfig, SizeDirection
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.scheduler import schedule
from tests.scheduling.builders import SnapshotBuilder

ONLY = {
    name: OrderingWeights(
        **{
            k: (1.0 if k == name else 0.0)
            for k in ("priority", "size", "age", "fairshare", "efficiency")
        }
    )
    for name in ("priority", "size", "age", "fairshare", "efficiency")
}


def order(snap, **config):  # type: ignore[no-untyped-def]
    return schedule(snap, SchedulerConfig(**config)).order


# ----------------------------------------------------------------------------- ordering


def test_a_high_priority_job_is_considered_before_a_normal_one():
    snap = SnapshotBuilder().node("n1").job("normal", priority=500).job("high", priority=900)
    assert order(snap.build(), weights=ONLY["priority"]) == ("high", "normal")


def test_small_jobs_go_first_by_default_and_large_first_when_asked():
    snap = SnapshotBuilder().node("n1", gpus=8).job("big", gpus=4).job("small", gpus=0.5).build()
    assert order(snap, weights=ONLY["size"]) == ("small", "big")
    assert order(snap, weights=ONLY["size"], size_direction=SizeDirection.LARGE_FIRST) == (
        "big",
        "small",
    )


def test_a_job_that_waited_longer_goes_first():
    snap = SnapshotBuilder(now=10_000).node("n1").job("new", submit=9_000).job("old", submit=100)
    assert order(snap.build(), weights=ONLY["age"]) == ("old", "new")


def test_a_tenant_that_used_less_goes_first():
    snap = (
        SnapshotBuilder()
        .tenant("heavy", usage=9e6)
        .tenant("light", usage=1e6)
        .node("n1")
        .job("h", tenant="heavy", submit=1)
        .job("l", tenant="light", submit=2)
        .build()
    )
    assert order(snap, weights=ONLY["fairshare"]) == ("l", "h")


def test_a_bigger_fair_share_offsets_more_usage():
    snap = (
        SnapshotBuilder()
        .tenant("big", fair_share=4.0, usage=2e6)
        .tenant("small", fair_share=1.0, usage=1e6)
        .node("n1")
        .job("s", tenant="small", submit=1)
        .job("b", tenant="big", submit=2)
        .build()
    )
    assert order(snap, weights=ONLY["fairshare"]) == ("b", "s")


def test_a_job_that_accepts_the_free_gpu_models_goes_first():
    snap = (
        SnapshotBuilder()
        .node("a", gpus=8, model="A100")
        .node("t", gpus=2, model="T4", memory_mib=15360)
        .job("t4-only", gpu_types=["T4"], submit=1)
        .job("any", submit=2)
        .build()
    )
    assert order(snap, weights=ONLY["efficiency"]) == ("any", "t4-only")


def test_ties_break_by_eligible_time_then_id():
    snap = SnapshotBuilder().node("n1").job("b", submit=5).job("a", submit=5).job("c", submit=1)
    assert order(snap.build(), weights=ONLY["priority"]) == ("c", "a", "b")


def test_explain_gives_every_factor_in_0_1_with_the_design_weights():
    snap = (
        SnapshotBuilder(now=5000)
        .tenant("team-a", usage=5e5)
        .tenant("team-b", usage=5e5)
        .node("n1")
        .job("j", priority=900, gpus=1, submit=0)
        .build()
    )
    table = schedule(snap).explain("j")
    weights = {f.name: f.weight for f in table.factors}
    assert weights == {
        "priority": 0.30,
        "size": 0.25,
        "age": 0.20,
        "fairshare": 0.15,
        "efficiency": 0.10,
    }
    values = {f.name: f.value for f in table.factors}
    assert all(0.0 <= v <= 1.0 for v in values.values())
    assert values["priority"] == 1.0
    assert values["size"] == pytest.approx(1 - 1000 / 4000)
    assert values["age"] == pytest.approx(5000 / (7 * 86400))
    assert values["fairshare"] == pytest.approx(2 ** -(0.5 / 0.5))
    assert table.score == pytest.approx(sum(f.weight * f.value for f in table.factors))


def test_fifo_ordering_is_registered():
    snap = SnapshotBuilder().node("n1").job("late", submit=9, priority=900).job("early", submit=1)
    assert order(snap.build(), ordering="fifo") == ("early", "late")


def test_bad_config_values_are_refused_with_a_hint():
    with pytest.raises(InvalidValue, match="use a number >= 0"):
        OrderingWeights(priority=-1)
    with pytest.raises(InvalidValue, match="at least one factor"):
        OrderingWeights(0, 0, 0, 0, 0)
    with pytest.raises(InvalidValue, match="positive number of seconds"):
        SchedulerConfig(max_age_s=0)
    with pytest.raises(InvalidValue, match="preemption_enabled=False"):
        SchedulerConfig(max_victims_per_job=0)
    snap = SnapshotBuilder().node("n1").job("j").build()
    for stage in ("ordering", "admission", "preemption", "backfill"):
        with pytest.raises(InvalidValue, match="use one of"):
            schedule(snap, SchedulerConfig(**{stage: "nope"}))


# ----------------------------------------------------------------------------- admission


def test_a_job_over_its_tenants_limit_waits_with_quota_exceeded():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", guaranteed=1000, limit=2000)
        .run("r", node="n1", devices=[0], tenant="team-a")
        .job("j", gpus=2, tenant="team-a", preemptible=True)
        .build()
    )
    d = schedule(snap)
    assert d.pending["j"].reason is PendingReason.QUOTA_EXCEEDED
    assert "limit of 2" in d.pending["j"].message


def test_within_the_limit_a_preemptible_job_borrows_idle_capacity():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", guaranteed=1000, limit=3000)
        .job("in", gpus=1, tenant="team-a", submit=1)
        .job("borrow", gpus=1, tenant="team-a", preemptible=True, submit=2)
        .build()
    )
    d = schedule(snap, SchedulerConfig(weights=ONLY["age"]))
    first, second = d.start_of("in"), d.start_of("borrow")
    assert first is not None
    assert not first.borrowing
    assert second is not None
    assert second.borrowing


def test_a_non_preemptible_job_may_not_borrow():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", guaranteed=1000, limit=3000)
        .job("j", gpus=2, tenant="team-a")
        .build()
    )
    d = schedule(snap)
    assert d.pending["j"].reason is PendingReason.QUOTA_EXCEEDED
    assert "mark the job preemptible" in d.pending["j"].message


def test_the_limit_holds_for_jobs_started_in_the_same_cycle():
    snap = SnapshotBuilder().node("n1", gpus=8).quota("team-a", guaranteed=3000, limit=3000)
    for i in range(5):
        snap.job(f"j{i}", gpus=1, tenant="team-a")
    d = schedule(snap.build())
    assert sum(s.gpu_milli for s in d.starts) == 3000
    assert sum(p.reason is PendingReason.QUOTA_EXCEEDED for p in d.pending.values()) == 2


def test_a_memory_limit_counts_resolved_gpu_memory():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=2)
        .quota("team-a", guaranteed=2000, limit=2000, limit_memory=100_000)
        .job("a", gpus=1, tenant="team-a", submit=1)  # takes all 80 GiB of its card
        .job("b", gpus=0.5, memory="30GiB", tenant="team-a", submit=2)
        .build()
    )
    d = schedule(snap, SchedulerConfig(weights=ONLY["age"]))
    assert d.start_of("a") is not None
    assert d.pending["b"].reason is PendingReason.QUOTA_EXCEEDED


def test_an_exhausted_gpu_hour_budget_holds_new_jobs():
    snap = (
        SnapshotBuilder()
        .node("n1")
        .quota("team-a", guaranteed=4000, budget=100.0, budget_used=100.0)
        .job("j", tenant="team-a")
        .build()
    )
    d = schedule(snap)
    assert d.pending["j"].reason is PendingReason.BUDGET_EXHAUSTED
    assert "GPU-hours" in d.pending["j"].message


def test_a_tenant_without_quota_is_not_limited():
    snap = SnapshotBuilder().node("n1", gpus=4).job("j", gpus=4, tenant="free").build()
    assert schedule(snap).start_of("j") is not None


def test_admission_none_ignores_quotas():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", limit=0)
        .job("j", gpus=1, tenant="team-a")
        .build()
    )
    assert schedule(snap).start_of("j") is None
    assert schedule(snap, SchedulerConfig(admission="none")).start_of("j") is not None


# ----------------------------------------------------------------------------- queue states


def test_held_not_eligible_unknown_pool_and_cycle_limit_say_why():
    snap = (
        SnapshotBuilder(now=100)
        .node("n1", gpus=8)
        .job("held", held=True, submit=1)
        .job("later", eligible=150, submit=2)
        .job("nowhere", pool="mars", submit=3)
        .job("ok", submit=4)
        .job("cut", submit=160)
        .build()
    )
    d = schedule(snap, SchedulerConfig(ordering="fifo", max_jobs_per_cycle=4))
    reasons = {k: v.reason for k, v in d.pending.items()}
    assert reasons == {
        "held": PendingReason.HELD,
        "later": PendingReason.BEGIN_TIME,  # never run, eligible after its submit: --begin
        "nowhere": PendingReason.POOL_UNKNOWN,
        "cut": PendingReason.CYCLE_LIMIT,
    }
    assert d.pending["later"].estimated_start == 150
    assert "default" in d.pending["nowhere"].message
    assert d.start_of("ok") is not None
