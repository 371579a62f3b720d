"""The grace period of failure detection: silence while the server was away (stopped, not
leading, or without its store) is not held against a node (issue 17 item 2, issue 18 item 4)."""

from __future__ import annotations

from unittest import mock

import pytest

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Unavailable
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from tests.control.builders import ADMIN, heartbeat, register, running, submit


def _running_job(cp: ControlPlane) -> str:
    register(cp, "n1")
    job = submit(cp, requeue="on-preemption")
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    loop.cycle()
    aid = heartbeat(cp, "n1").start[0].assignment_id
    heartbeat(cp, "n1", replicas=[running(aid)])
    loop.leadership.release()
    return job.id


def test_a_server_started_after_a_long_stop_judges_no_node_before_its_grace_ends(
    cp: ControlPlane, clock: ManualClock
) -> None:
    job_id = _running_job(cp)
    clock.advance(10 * cp.settings.node_timeout_s)  # the server was stopped meanwhile
    loop = SchedulingLoop(cp)  # a new server process
    try:
        loop.run_once()
        clock.advance(cp.settings.node_timeout_s - 1)
        loop.run_once()
        detail = JobService(cp).get(ADMIN.principal, job_id)
        assert (detail.job.state, detail.job.restart_count) == (JobState.RUNNING, 0)
        # The node still says nothing once the grace is over: now it is down.
        clock.advance(2)
        loop.run_once()
        assert JobService(cp).get(ADMIN.principal, job_id).job.restart_count == 1
    finally:
        loop.leadership.release()


def test_a_store_outage_starts_the_grace_again_when_the_store_returns(
    cp: ControlPlane, clock: ManualClock
) -> None:
    job_id = _running_job(cp)
    loop = SchedulingLoop(cp)
    try:
        loop.run_once()
        with (
            mock.patch.object(
                loop.nodes, "mark_silent_nodes_down", side_effect=Unavailable("store down")
            ),
            pytest.raises(Unavailable),
        ):
            loop.run_once()
        assert loop.watching_since is None
        clock.advance(5 * cp.settings.node_timeout_s)  # the outage
        loop.run_once()  # the store is back: grace from now
        detail = JobService(cp).get(ADMIN.principal, job_id)
        assert (detail.job.state, detail.job.restart_count) == (JobState.RUNNING, 0)
        clock.advance(cp.settings.node_timeout_s - 1)
        loop.run_once()
        assert JobService(cp).get(ADMIN.principal, job_id).job.restart_count == 0
    finally:
        loop.leadership.release()
