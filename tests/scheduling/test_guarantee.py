"""Issue 27: a guarantee that always starts.

A job that its quota can never admit (alone over the limit, or not preemptible and alone over
the guarantee) used to wait forever on an empty cluster with "wait for the tenant's other jobs
to finish"; an in-quota job waiting for borrowers still exempt from reclaim said only that it
starts when running jobs end. Both now say which limit, when and what to change.
"""

from __future__ import annotations

from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import PendingReason
from gpupool.scheduling.scheduler import schedule
from tests.scheduling.builders import SnapshotBuilder


def test_a_non_preemptible_job_over_its_guarantee_says_it_can_never_start_on_an_empty_cluster():
    # The replay of the issue: 15 teams guaranteed under one GPU each on 2 GPUs, 20 jobs of
    # one GPU that are not preemptible: none ever started, and nothing said why.
    snap = SnapshotBuilder().node("n1", gpus=2)
    for t in range(15):
        snap.quota(f"app{t}", guaranteed=2000 // 15)
    for i in range(20):
        snap.job(f"j{i}", gpus=1, tenant=f"app{i % 15}")
    d = schedule(snap.build())
    assert not d.starts
    for i in range(20):
        info = d.pending[f"j{i}"]
        assert info.reason is PendingReason.QUOTA_EXCEEDED
        assert "can never start" in info.message
        assert "guaranteed 0.133 GPUs in pool default" in info.message
        assert "mark the job preemptible (--preemptible)" in info.message
        assert f"gpupool quota set app{i % 15} default" in info.message


def test_the_same_job_marked_preemptible_borrows_the_idle_cluster():
    snap = SnapshotBuilder().node("n1", gpus=2).quota("app0", guaranteed=133)
    snap.job("j", gpus=1, tenant="app0", preemptible=True)
    start = schedule(snap.build()).start_of("j")
    assert start is not None
    assert start.borrowing


def test_a_job_alone_over_its_limit_names_the_limit_not_other_jobs():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", guaranteed=1000, limit=2000)
        .job("j", gpus=3, tenant="team-a", preemptible=True)
        .build()
    )
    info = schedule(snap).pending["j"]
    assert info.reason is PendingReason.QUOTA_EXCEEDED
    assert "more than tenant team-a's limit of 2 GPUs" in info.message
    assert "can never start: ask for at most 2 GPUs" in info.message


def test_a_job_within_its_guarantee_behind_its_own_jobs_still_waits_for_them():
    snap = (
        SnapshotBuilder()
        .node("n1", gpus=4)
        .quota("team-a", guaranteed=1000, limit=3000)
        .run("r", node="n1", devices=[0], tenant="team-a", milli=500)
        .job("j", gpus=1, tenant="team-a")
        .build()
    )
    info = schedule(snap).pending["j"]
    assert info.reason is PendingReason.QUOTA_EXCEEDED
    assert "can never start" not in info.message
    assert "wait for the tenant's other jobs to finish" in info.message


def _course_and_research(now: float) -> SnapshotBuilder:
    """course is guaranteed the node's one GPU; research borrowed it at t=940."""
    return (
        SnapshotBuilder(now=now)
        .node("n1", gpus=1)
        .quota("course", guaranteed=1000)
        .quota("research", guaranteed=0, limit=1000)
        .run(
            "borrowed",
            node="n1",
            devices=[0],
            tenant="research",
            preemptible=True,
            start=940,
            borrowing=True,
        )
        .job("lesson", gpus=1, tenant="course")
    )


def test_a_guarantee_held_by_exempt_borrowers_says_when_and_why():
    # Borrowers are exempt from reclaim for their first 300 s; it is 60 s in.
    config = SchedulerConfig(preempt_exempt_s=300)
    d = schedule(_course_and_research(1000).build(), config)
    info = d.pending["lesson"]
    assert not d.preemptions
    assert "borrowed job(s) borrowed of research" in info.message
    assert "exempt from reclaim for their first 300 s" in info.message
    assert "it reclaims them in 240 s (at t=1240)" in info.message
    assert info.estimated_start == 1240
    # Once the exemption is over, the same job reclaims its share.
    later = schedule(_course_and_research(1241).build(), config)
    assert [p.victim for p in later.preemptions] == ["borrowed"]
