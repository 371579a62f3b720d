"""One scenario through both adapters of the decision applier: the same victims, the same starts.

Three preemptible one-GPU jobs fill a 3-GPU machine, started 10 s apart; 400 s in (past the
scheduler's 300 s preemption exemption) a high-priority one-GPU job arrives. The first cycle
must choose exactly one victim (the latest started, which loses the least work), the cycles
during its 15 s grace period none more (the victim is stopping *for* the high job), and the high
job starts on the victim's GPU once it has stopped.

The same happens on the live server's loop against a real store (SQLite, and PostgreSQL when
reachable) and in the simulator's replay; both go through
:func:`gpupool.control.machinery.apply.apply_decision` (recorded here), so a replay test
exercises the server's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from sqlalchemy import select

import gpupool.control.machinery.loop as loop_module
import gpupool.sim.replay as replay_module
from gpupool.control.context import ControlPlane
from gpupool.control.machinery.apply import Applied, DecisionTarget, apply_decision
from gpupool.control.machinery.apply_store import StoreTarget
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.sim.options import ReplayOptions
from gpupool.sim.replay import Replay, replay
from gpupool.sim.scenarios import Scenario
from gpupool.store.models import AssignmentModel
from tests.control.builders import ADMIN, exited, heartbeat, register, running, submit
from tests.sim.builders import cluster, job, workload

GRACE_S = 15
HIGH_AT = 400


@dataclass(frozen=True)
class Step:
    """One applied decision that did something: who started (on which GPU index), who was
    told to stop, at which second of the scenario."""

    at: float
    started: tuple[tuple[str, tuple[int, ...]], ...]
    preempted: tuple[str, ...]


class Recorder:
    """Wraps ``apply_decision`` in the loop's and the replay's modules; keeps each change."""

    def __init__(self, names: Callable[[str], str], origin: float) -> None:
        self.names = names
        self.origin = origin
        self.steps: list[Step] = []
        self.targets: set[type] = set()
        self.now = origin

    def __call__(self, decision: Decision, target: DecisionTarget) -> Applied:
        applied = apply_decision(decision, target)
        self.targets.add(type(target))
        if applied.changed:
            started = tuple(
                (
                    self.names(s.job_id),
                    tuple(int(u.rsplit("gpu", 1)[1]) for r in s.replicas for u in r.devices),
                )
                for s in decision.starts
                if s.job_id in applied.started
            )
            preempted = tuple(self.names(v) for v in applied.preempted)
            self.steps.append(Step(self.now - self.origin, started, preempted))
        return applied


EXPECTED = [
    Step(0, (("low0", (0,)),), ()),
    Step(10, (("low1", (1,)),), ()),
    Step(20, (("low2", (2,)),), ()),
    Step(HIGH_AT, (), ("low2",)),
    Step(HIGH_AT + GRACE_S, (("high", (2,)),), ()),
]


def test_the_server_loop_and_the_replay_preempt_the_same_one_victim_and_start_the_same_jobs(
    cp: ControlPlane, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --- the live server's loop, against the store
    names: dict[str, str] = {}
    origin = cp.now()
    server = Recorder(lambda job_id: names[job_id], origin)
    monkeypatch.setattr(loop_module, "apply_decision", server)
    register(cp, gpus=3)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    live: list[str] = []  # assignment ids the agent runs

    def cycle() -> None:
        server.now = cp.now()
        loop.cycle()
        answer = heartbeat(cp, replicas=[running(a) for a in live])
        live.extend(order.assignment_id for order in answer.start)
        heartbeat(cp, replicas=[running(a) for a in live])  # the new ones report running

    low = []
    for i in range(3):
        j = submit(
            cp,
            f"low{i}",
            gpus="1",
            priority="low",
            preemptible=True,
            checkpoint={"grace": f"{GRACE_S}s"},
        )
        names[j.id] = f"low{i}"
        low.append(j.id)
        cycle()
        clock.advance(10)
    clock.advance(HIGH_AT - 30)
    high = submit(cp, "high", gpus="1", priority="high")
    names[high.id] = "high"
    cycle()  # chooses the victim
    for _ in range(3):  # cycles during its grace period choose no other
        clock.advance(1)
        cycle()
    jobs = JobService(cp)
    states = [jobs.get(ADMIN.principal, j).job.state for j in low]
    assert states == [JobState.RUNNING, JobState.RUNNING, JobState.COMPLETING]
    with cp.read() as s:
        victim = s.scalars(select(AssignmentModel).where(AssignmentModel.job_id == low[2])).one()
        assert (victim.stop_reason, victim.stop_for) == ("preempt", high.id)
    clock.advance(GRACE_S - 3)
    # The victim's agent gets its stop order and reports it stopped; its GPU goes to the high job.
    answer = heartbeat(cp, replicas=[running(a) for a in live])
    assert [(o.assignment_id, o.reason.value, o.grace_period_s) for o in answer.stop] == [
        (victim.id, "preempt", GRACE_S)
    ]
    live.remove(victim.id)
    heartbeat(cp, replicas=[*(running(a) for a in live), exited(victim.id, -15, "SIGTERM")])
    cycle()
    assert jobs.get(ADMIN.principal, high.id).job.state is JobState.RUNNING
    assert server.targets == {StoreTarget}

    # --- the simulator's replay of the same trace, with the server's scheduler configuration
    trace = workload(
        *(job(f"low{i}", 10 * i, 1, 1000, priority="low", preemptible=True) for i in range(3)),
        job("high", HIGH_AT, 1, 20, priority="high"),
    )
    sim = Recorder(lambda job_id: job_id, 0.0)
    monkeypatch.setattr(replay_module, "apply_decision", sim)
    real_cycle = Replay._cycle

    def timed_cycle(self: Replay, now: float) -> bool:
        sim.now = now
        return real_cycle(self, now)

    monkeypatch.setattr(Replay, "_cycle", timed_cycle)
    server_defaults = Scenario("server", "the server's defaults", SchedulerConfig(), False, False)
    options = ReplayOptions(
        checkpoint_interval_s=None, grace_period_s=GRACE_S, tick_s=1.0, expected_duration="unknown"
    )
    result = replay(trace, cluster(3), server_defaults, options)
    assert sim.targets == {Replay}
    assert {j.id: j.preemptions for j in result.jobs} == {
        "low0": 0,
        "low1": 0,
        "low2": 1,
        "high": 0,
    }

    # --- the same victims and starts, at the same seconds of the scenario
    assert server.steps == EXPECTED
    assert sim.steps[: len(EXPECTED)] == EXPECTED
