"""A tiny trace worked out by hand: every start and end time is asserted.

Cluster: one machine with 2 GPUs. Jobs (arrival, GPUs, work):

    j1  t=0   1    100 s
    j2  t=10  0.5   50 s
    j3  t=20  2     30 s
    j4  t=30  0.5   10 s

exclusive (whole GPUs, FIFO, no backfill): j1 0-100 and j2 (rounded up to 1 GPU) 10-60; j3
needs both GPUs and waits for j1: 100-130; j4 waits behind j3 although a GPU is free from 60:
130-140.

pooled: j1 0-100; j2 takes half of the second GPU 10-60; j3 waits for j1 (100-130); j4 takes
the other half of the second GPU at once, 30-40, since it ends before j3 can start (backfill).
"""

from __future__ import annotations

import pytest

from gpupool.sim.replay import ReplayOptions, replay
from gpupool.sim.scenarios import get_scenario
from tests.sim.builders import cluster, job, workload

NO_TICK = ReplayOptions(tick_s=None)


def times(result):  # type: ignore[no-untyped-def]
    return {j.id: (j.first_start, j.end_time) for j in result.jobs}


TRACE = workload(
    job("j1", 0, 1, 100),
    job("j2", 10, 0.5, 50),
    job("j3", 20, 2, 30),
    job("j4", 30, 0.5, 10),
)


def test_exclusive_runs_whole_gpus_in_fifo_order_without_backfill() -> None:
    result = replay(TRACE, cluster(2), get_scenario("exclusive"), NO_TICK)
    assert times(result) == {
        "j1": (0, 100),
        "j2": (10, 60),
        "j3": (100, 130),
        "j4": (130, 140),
    }
    assert all(j.outcome == "completed" for j in result.jobs)


def test_pooled_shares_a_gpu_and_backfills_without_delaying_the_blocked_job() -> None:
    result = replay(TRACE, cluster(2), get_scenario("pooled"), NO_TICK)
    assert times(result) == {
        "j1": (0, 100),
        "j2": (10, 60),
        "j3": (100, 130),
        "j4": (30, 40),
    }


def test_time_series_steps_at_each_event_instant() -> None:
    result = replay(TRACE, cluster(2), get_scenario("pooled"), NO_TICK)
    series = result.series
    assert series.time == (0, 10, 20, 30, 40, 60, 100, 130)
    assert series.allocated_milli == (1000, 1500, 1500, 2000, 1500, 1000, 2000, 0)
    assert series.busy_gpus == (1, 2, 2, 2, 2, 1, 2, 0)
    assert series.pending_jobs == (0, 0, 1, 1, 1, 1, 0, 0)
    assert series.stranded_milli == (0, 500, 500, 0, 500, 0, 0, 0)


def test_preemption_loses_work_since_the_last_checkpoint_and_requeues() -> None:
    # Two GPUs, two teams guaranteed one GPU each. team-b's low-priority preemptible job takes
    # both GPUs from 0 (borrowing one) and checkpoints every 30 s. team-a's high-priority job
    # arrives at 400 (after the scheduler's 300 s preemption exemption) and reclaims its GPU.
    # The victim's last checkpoint is at 390: 10 s of work on 2 GPUs are lost. It stops at once
    # (no grace), the high job runs 400-420, the victim resumes at 420 with 1000 - 390 = 610 s
    # left and ends at 1030.
    trace = workload(
        job("low", 0, 2, 1000, tenant="team-b", priority="low", preemptible=True),
        job("high", 400, 1, 20, tenant="team-a", priority="high"),
    )
    options = ReplayOptions(checkpoint_interval_s=30, tick_s=None)
    result = replay(trace, cluster(2), get_scenario("pooled"), options)
    low, high = result.jobs
    assert (high.first_start, high.end_time) == (400, 420)
    assert (low.first_start, low.end_time) == (0, 1030)
    assert low.preemptions == 1
    assert low.attempts == 2
    assert low.lost_work_s == pytest.approx(10)
    assert low.lost_milli_s == pytest.approx(10 * 2000)
    assert low.used_milli_s == pytest.approx((400 + 610) * 2000)


PREEMPTION_TRACE = workload(
    job("low", 0, 2, 1000, tenant="team-b", priority="low", preemptible=True),
    job("high", 400, 1, 20, tenant="team-a", priority="high"),
)


def test_grace_period_keeps_the_victims_slices_until_it_stops() -> None:
    options = ReplayOptions(checkpoint_interval_s=None, grace_period_s=15, tick_s=None)
    result = replay(PREEMPTION_TRACE, cluster(2), get_scenario("pooled"), options)
    low, high = result.jobs
    assert (high.first_start, high.end_time) == (415, 435)
    # No checkpoints: the whole first run (415 s held) is lost and redone from scratch.
    assert (low.first_start, low.end_time) == (0, 1435)
    assert low.lost_work_s == pytest.approx(415)


def test_node_failure_requeues_its_jobs_from_their_last_checkpoint() -> None:
    from gpupool.sim.replay import NodeFailure

    trace = workload(job("a", 0, 1, 100), job("b", 0, 1, 100))
    # Two machines of one GPU; node-0000 fails at 50 for 20 s. Its job checkpointed at 40
    # (10 s lost, 60 s left); the other machine is busy, so it waits for the repair at 70 and
    # ends at 130.
    options = ReplayOptions(
        checkpoint_interval_s=20,
        tick_s=None,
        failures=(NodeFailure("node-0000", 50, 20),),
    )
    result = replay(trace, cluster(2, per_node=1), get_scenario("pooled"), options)
    by_id = {j.id: j for j in result.jobs}
    failed = next(j for j in result.jobs if j.node_failures)
    other = by_id["b" if failed.id == "a" else "a"]
    assert (other.first_start, other.end_time) == (0, 100)
    assert failed.end_time == 70 + 60
    assert failed.lost_work_s == pytest.approx(10)


def test_a_minimum_cycle_interval_coalesces_cycles_onto_its_multiples() -> None:
    # Cycles only at multiples of 25 s: j1 and j2 start at 25 (j2 ends 75, j1 125); j3 waits
    # for both GPUs: the cycle after 125 is at 150 (150-180); j4 behind it starts at 200.
    options = ReplayOptions(tick_s=None, min_cycle_interval_s=25)
    result = replay(TRACE, cluster(2), get_scenario("exclusive"), options)
    assert times(result) == {
        "j1": (25, 125),
        "j2": (25, 75),
        "j3": (150, 180),
        "j4": (200, 210),
    }
    assert result.cycles == 5  # at 25, 50, 100, 150 and 200


def test_report_numbers_of_the_hand_checked_trace() -> None:
    from gpupool.sim.metrics import summarise

    pooled = summarise(replay(TRACE, cluster(2), get_scenario("pooled"), NO_TICK))
    exclusive = summarise(replay(TRACE, cluster(2), get_scenario("exclusive"), NO_TICK))
    # Arrivals span 0-30. Pooled holds 1, 1.5, 1.5 GPUs over its three 10 s steps; exclusive
    # 1, 2, 2 (j2 takes a whole GPU).
    assert pooled.allocation_while_arriving == pytest.approx(40 / 60)
    assert exclusive.allocation_while_arriving == pytest.approx(50 / 60)
    assert (pooled.makespan_s, exclusive.makespan_s) == (130, 140)
    # Queueing delays: pooled 0, 0, 80, 0; exclusive 0, 0, 80, 100.
    assert pooled.queueing_delay.p50 == 0
    assert exclusive.queueing_delay.mean == pytest.approx(45)
    # GPU-seconds: pooled 100 + 25 + 60 + 5 = 190; exclusive 100 + 50 + 60 + 10 = 220.
    assert pooled.used_gpu_hours * 3600 == pytest.approx(190)
    assert exclusive.used_gpu_hours * 3600 == pytest.approx(220)
    assert pooled.preemptions == exclusive.preemptions == 0


def test_a_job_needing_one_slot_preempts_exactly_one_of_three_during_the_grace() -> None:
    # The live server's scenario (tests/e2e/test_preemption.py) in the replay: three preemptible
    # one-GPU jobs fill a 3-GPU machine; a high-priority one-GPU job arrives at 400. The victim
    # keeps its slices for its 15 s grace while cycles run every second; each cycle must see the
    # replica stopping for the high job and wait, so one job is preempted, not three.
    trace = workload(
        *(
            job(f"low{i}", 0, 1, 1000, tenant="team-b", priority="low", preemptible=True)
            for i in range(3)
        ),
        job("high", 400, 1, 20, tenant="team-a", priority="high"),
    )
    options = ReplayOptions(checkpoint_interval_s=None, grace_period_s=15, tick_s=1.0)
    result = replay(trace, cluster(3), get_scenario("pooled"), options)
    by_id = {j.id: j for j in result.jobs}
    assert (by_id["high"].first_start, by_id["high"].end_time) == (415, 435)
    assert sum(by_id[f"low{i}"].preemptions for i in range(3)) == 1
