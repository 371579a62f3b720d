"""The replay carries decisions out by the server's rules (control/machinery/apply.py).

Here the decisions are doctored so that a rule has something to refuse: the replay must refuse
as the live server's commit does, not carry out whatever the scheduler said.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision, Preemption, PreemptionReason
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.sim.replay import ReplayOptions, replay
from gpupool.sim.scenarios import Scenario, get_scenario
from tests.sim.builders import cluster, job, workload

NO_TICK = ReplayOptions(tick_s=None)


def test_a_start_onto_a_device_with_no_room_left_is_refused_and_waits() -> None:
    # One GPU, two whole-GPU jobs at t=0. The scheduler starts j1; the doctored decision also
    # starts j2 on the same GPU. The applier finds no room for j2, so it waits for j1's end.
    def overfill(
        snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo
    ) -> Decision:
        decision = schedule(snapshot, config, memo)
        waiting = [j.id for j in snapshot.pending if decision.start_of(j.id) is None]
        if not decision.starts or not waiting:
            return decision
        extra = replace(decision.starts[0], job_id=waiting[0])
        return replace(decision, starts=(*decision.starts, extra))

    trace = workload(job("j1", 0, 1, 100), job("j2", 0, 1, 50))
    result = replay(trace, cluster(1), get_scenario("pooled"), NO_TICK, schedule=overfill)
    times = {j.id: (j.first_start, j.end_time) for j in result.jobs}
    assert times == {"j1": (0, 100), "j2": (100, 150)}
    assert max(result.series.allocated_milli) <= 1000


def test_a_victim_named_again_while_it_stops_is_stopped_once() -> None:
    # The doctored decisions name the victim again in every cycle while it is stopping: the
    # applier leaves it alone, so it is preempted once and its grace period is not restarted.
    def again(snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo) -> Decision:
        decision = schedule(snapshot, config, memo)
        stopping = [r for r in snapshot.running if r.preempted_for is not None]
        if stopping and not decision.preemptions:
            p = Preemption(stopping[0].job_id, "high", PreemptionReason.PRIORITY, "again")
            return replace(decision, preemptions=(p,))
        return decision

    trace = workload(
        job("low", 0, 1, 1000, priority="low", preemptible=True),
        job("high", 400, 1, 20, priority="high"),
    )
    options = ReplayOptions(checkpoint_interval_s=None, grace_period_s=15, tick_s=1.0)
    no_quotas = Scenario("no-quotas", "pooled without quotas", SchedulerConfig(), False, False)
    result = replay(trace, cluster(1), no_quotas, options, schedule=again)
    by_id = {j.id: j for j in result.jobs}
    assert by_id["low"].preemptions == 1
    assert (by_id["high"].first_start, by_id["high"].end_time) == (415, 435)
