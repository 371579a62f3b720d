"""The scheduling loop owns one scheduler memo and hands it to every cycle it runs."""

from __future__ import annotations

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.scheduler import schedule
from gpupool.scheduling.snapshot import ClusterSnapshot
from tests.control.builders import register, submit


def test_the_loop_passes_its_one_memo_to_every_cycle_and_it_keeps_the_layout(
    cp: ControlPlane,
) -> None:
    register(cp, gpus=2)
    given: list[SchedulerMemo] = []

    def recording(
        snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo
    ) -> Decision:
        given.append(memo)
        return schedule(snapshot, config, memo)

    loop = SchedulingLoop(cp, schedule=recording)
    assert loop.leadership.try_acquire()
    first = submit(cp, "a")
    assert loop.cycle().started == (first.id,)
    remembered = loop.memo.layouts
    second = submit(cp, "b")
    assert loop.cycle().started == (second.id,)
    assert given == [loop.memo, loop.memo]
    assert given[0] is given[1]
    # The node and its devices did not change: the second cycle reused the first one's layout.
    assert len(remembered) == 1
    assert loop.memo.layouts == remembered
    assert SchedulingLoop(cp).memo is not loop.memo  # another loop, another memo
