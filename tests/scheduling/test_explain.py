"""``explain_job``: what a user reads when they ask why their job waits."""

from __future__ import annotations

from gpupool.scheduling import SchedulerConfig, explain_job, schedule
from gpupool.scheduling.explain import factor_rows
from tests.scheduling.builders import SnapshotBuilder

NOW = 10_000.0


def test_a_pending_job_is_explained_with_reason_estimate_position_and_factors():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=1)
    b.run("r", node="n1", expected_end=NOW + 1500)
    d = schedule(b.job("j", gpus=1).build())
    text = explain_job(d, "j", NOW)
    assert "pending (InsufficientGpu)" in text
    assert "estimated start: in 00:25:00" in text
    assert "queue position: 1 of 1" in text
    for name in ("priority", "size", "age", "fairshare", "efficiency", "score"):
        assert name in text


def test_a_started_job_says_where_and_on_what_terms():
    d = schedule(SnapshotBuilder(now=NOW).node("n1", gpus=2).job("j", gpus=2).build())
    text = explain_job(d, "j", NOW)
    assert text.startswith("job j: starts now, in quota: rank 0 on n1 (n1-gpu0, n1-gpu1)")


def test_a_preemptor_lists_its_victims():
    b = SnapshotBuilder(now=NOW).node("n1", gpus=1)
    b.run("low", node="n1", priority=100, preemptible=True)
    d = schedule(b.job("j", priority=900).build())
    assert "preempting low (Priority)" in explain_job(d, "j", NOW)


def test_an_unknown_job_is_said_to_be_outside_the_cycle():
    d = schedule(SnapshotBuilder(now=NOW).node("n1").build())
    assert "not in this scheduling cycle" in explain_job(d, "nope", NOW)


def test_factor_rows_end_with_the_score():
    d = schedule(SnapshotBuilder(now=NOW).node("n1").job("j").build(), SchedulerConfig())
    rows = factor_rows(d.explain("j"))
    assert [r[0] for r in rows] == ["priority", "size", "age", "fairshare", "efficiency", "score"]
    assert float(rows[-1][3]) == round(d.explain("j").score, 3)
