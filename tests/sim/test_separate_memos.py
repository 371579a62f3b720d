"""Two replays in one process, cycles interleaved, decide exactly as each does alone.

Each ``Replay`` keeps its own scheduler memo (``Replay.memo``); nothing in the scheduler is
shared between them (it used to keep one module-level layout cache for every caller). The two
replays here run in two threads that take turns cycle by cycle, so every cycle of one falls
between two cycles of the other.
"""

from __future__ import annotations

import pickle
import threading

from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.sim.replay import Replay, ReplayOptions, ReplayResult
from gpupool.sim.scenarios import get_scenario
from gpupool.sim.trace_synthetic import SyntheticSpec, synthetic_cluster, synthetic_workload

# Same cluster shape for both (equal layout keys: the case a shared cache served from one
# entry), different jobs and scenarios.
_SPECS = (
    (SyntheticSpec(jobs=80, gpus=16, tenants=3, load=1.3, median_work_s=600, seed=1), "pooled"),
    (SyntheticSpec(jobs=80, gpus=16, tenants=3, load=1.3, median_work_s=600, seed=2), "exclusive"),
)


class _Turns:
    """Lets two threads run one scheduling cycle each in turn (until one of them is done)."""

    def __init__(self) -> None:
        self.turn = 0
        self.done = [False, False]
        self.order: list[int] = []  # whose cycle ran, in order
        self.cond = threading.Condition()

    def wait_for(self, me: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == me or self.done[1 - me])

    def pass_on(self, me: int) -> None:
        with self.cond:
            self.order.append(me)
            self.turn = 1 - me
            self.cond.notify_all()

    def finish(self, me: int) -> None:
        with self.cond:
            self.done[me] = True
            self.cond.notify_all()


def _replay(index: int, turns: _Turns | None = None) -> tuple[Replay, ReplayResult, list[Decision]]:
    spec, scenario = _SPECS[index]
    decisions: list[Decision] = []

    def in_turn(
        snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo
    ) -> Decision:
        if turns is not None:
            turns.wait_for(index)
        decision = schedule(snapshot, config, memo)
        decisions.append(decision)
        if turns is not None:
            turns.pass_on(index)
        return decision

    sim = Replay(
        synthetic_workload(spec),
        synthetic_cluster(spec),
        get_scenario(scenario),
        ReplayOptions(checkpoint_interval_s=300, grace_period_s=5),
        schedule=in_turn,
    )
    try:
        result = sim.run()
    finally:
        if turns is not None:
            turns.finish(index)
    return sim, result, decisions


def test_two_replays_taking_turns_in_one_process_decide_as_each_alone() -> None:
    alone = [_replay(i) for i in range(2)]
    turns = _Turns()
    together: list[tuple[Replay, ReplayResult, list[Decision]] | None] = [None, None]

    def run(i: int) -> None:
        together[i] = _replay(i, turns)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The cycles did interleave: one of each, in turn, until the shorter replay ended.
    both = 2 * min(len(alone[0][2]), len(alone[1][2]))
    assert turns.order[:both] == [0, 1] * (both // 2)
    for (_, result, decisions), other in zip(alone, together, strict=True):
        assert other is not None
        _, result_then, decisions_then = other
        assert len(decisions) > 20  # enough cycles for the turns to interleave
        assert decisions_then == decisions
        assert pickle.dumps(result_then.jobs) == pickle.dumps(result.jobs)
        assert pickle.dumps(result_then.series) == pickle.dumps(result.series)
    # Each replay's memo holds its own layout and its own replica objects, none of the other's.
    first, second = (entry[0] for entry in together)  # type: ignore[index]
    assert first.memo.layouts[0].layout is not second.memo.layouts[0].layout
    held = [
        {id(e[0]) for m in sim.memo.layouts for e in m.held.values()} for sim in (first, second)
    ]
    assert held[0]
    assert held[1]
    assert held[0].isdisjoint(held[1])
