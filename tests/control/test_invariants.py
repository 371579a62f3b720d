"""Property: whatever mix of submits, cancels, agent reports and node failures happens, the
store never holds more slices on a device than the device has (milli-GPU and memory), and a
job holds slices only while it has a live assignment."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gpupool.control.bootstrap import bootstrap
from gpupool.control.context import ControlPlane
from gpupool.control.errors import Conflict
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.jobs import JobService
from gpupool.control.settings import ServerSettings
from gpupool.store.models import AssignmentModel, SliceModel
from tests.control.builders import ADMIN, exited, heartbeat, register, running, submit
from tests.store.fixtures import START, device_load

ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(["0.25", "0.5", "1", "2"])),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("report"), st.integers(0, 2)),
        st.tuples(st.just("cycle"), st.just(0)),
        st.tuples(st.just("silence"), st.just(0)),
    ),
    min_size=5,
    max_size=40,
)


def _check(cp: ControlPlane) -> None:
    with cp.read() as s:
        for uuid, memory, milli, mem in device_load(s):
            assert milli <= 1000, f"{uuid} holds {milli}m"
            assert mem <= memory, f"{uuid} holds {mem} MiB of {memory}"
        orphaned = s.scalar(
            select(func.count())
            .select_from(SliceModel)
            .join(AssignmentModel, AssignmentModel.id == SliceModel.assignment_id)
            .where(SliceModel.active.is_(True), AssignmentModel.state == "finished")
        )
        assert orphaned == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_no_device_is_ever_over_capacity(sequence: list[tuple[str, str | int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(START)
        url = f"sqlite:///{Path(tmp) / 'g.db'}"
        cp = ControlPlane(
            ServerSettings(home=Path(tmp), database_url=url, schedule=False), clock=clock
        )
        cp.prepare()
        bootstrap(cp)
        register(cp, "n1", gpus=2)
        register(cp, "n2", gpus=2)
        loop = SchedulingLoop(cp)
        assert loop.leadership.try_acquire()
        jobs: list[str] = []
        try:
            for op, arg in sequence:
                clock.advance(1)
                if op == "submit":
                    jobs.append(submit(cp, f"j{len(jobs)}", gpus=str(arg)).id)
                elif op == "cancel" and jobs:
                    with contextlib.suppress(Conflict):  # already ended: fine
                        JobService(cp).cancel(ADMIN, jobs[int(arg) % len(jobs)])
                elif op == "report":
                    node = "n1" if int(arg) % 2 == 0 else "n2"
                    answer = heartbeat(cp, node)
                    stopping = {o.assignment_id for o in answer.stop}
                    reports = [running(a.assignment_id) for a in answer.start]
                    reports += [exited(aid, code=int(arg)) for aid in stopping]
                    heartbeat(cp, node, replicas=reports)
                elif op == "cycle":
                    loop.cycle()
                elif op == "silence":
                    clock.advance(cp.settings.node_timeout_s + 1)
                    heartbeat(cp, "n2")
                    loop.nodes.mark_silent_nodes_down(watching_since=0.0)
                _check(cp)
        finally:
            loop.leadership.release()
            cp.close()
