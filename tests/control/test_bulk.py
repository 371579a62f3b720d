"""Bulk cancel, hold and release (issue 27): a selection by ids and filters, changed in one
transaction, with the one-job calls' permissions, events and audit rows."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from gpupool.control.context import ControlPlane
from gpupool.control.errors import Invalid
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.arrays import submit_array
from gpupool.control.services.bulk import BulkAction, BulkService, Selection
from gpupool.control.services.jobs import JobService
from gpupool.domain.states import JobState
from gpupool.domain.users import Role
from gpupool.store.models import AuditModel, JobEventModel
from tests.control.builders import ADMIN, actor, heartbeat, register, running, submit

ALICE = actor("alice", Role.MEMBER, "default")
BOB = actor("bob", Role.MEMBER, "default")


def _state(cp: ControlPlane, job_id: str) -> JobState:
    return JobService(cp).get(ADMIN.principal, job_id).job.state


def _held(cp: ControlPlane, job_id: str) -> bool:
    return JobService(cp).get(ADMIN.principal, job_id).job.held


def test_cancel_by_user_and_state_in_one_transaction_with_events_and_audit(
    cp: ControlPlane,
) -> None:
    register(cp, gpus=1)
    jobs = JobService(cp)
    spec = {"command": ["true"], "resources": {"gpus": "1"}}
    mine = [jobs.submit(ALICE, {**spec, "name": f"a{i}"}, held=True)[0] for i in range(3)]
    theirs = submit(cp, "b", gpus="0.5", who=BOB)
    with cp.read() as s:
        events = int(s.scalar(select(func.count()).select_from(JobEventModel)) or 0)
    done = BulkService(cp).apply(
        ADMIN, BulkAction.CANCEL, Selection(user="alice", states=(JobState.PENDING,))
    )
    assert sorted(c.id for c in done.changed) == sorted(j.id for j in mine)
    assert {c.state for c in done.changed} == {"CANCELLED"}
    assert all(_state(cp, j.id) is JobState.CANCELLED for j in mine)
    assert _state(cp, theirs.id) is JobState.PENDING
    detail = JobService(cp).get(ADMIN.principal, mine[0].id).job
    assert detail.reason == "cancelled by admin"
    assert detail.version == mine[0].version + 1
    assert detail.end_time is not None
    with cp.read() as s:
        assert int(s.scalar(select(func.count()).select_from(JobEventModel)) or 0) == events + 3
        audits = s.scalars(select(AuditModel.target).where(AuditModel.action == "job.cancel"))
        assert sorted(audits) == sorted(j.id for j in mine)


def test_a_member_changes_only_its_own_jobs_and_is_told_of_the_rest(cp: ControlPlane) -> None:
    register(cp, gpus=1)
    a = submit(cp, "x", who=ALICE)
    b = submit(cp, "x", who=BOB)
    done = BulkService(cp).apply(BOB, BulkAction.HOLD, Selection(name="x"))
    assert [c.id for c in done.changed] == [b.id]
    assert done.refused == 1
    assert _held(cp, b.id)
    assert not _held(cp, a.id)
    again = BulkService(cp).apply(BOB, BulkAction.RELEASE, Selection(ids=(b.id,)))
    assert [(c.id, c.held) for c in again.changed] == [(b.id, False)]


def test_ids_arrays_not_found_and_skipped(cp: ControlPlane) -> None:
    register(cp, gpus=1)
    spec = {"name": "sweep", "command": ["true"], "resources": {"gpus": "0.1"}}
    tasks, _ = submit_array(JobService(cp), ADMIN, spec, "0-3")
    assert tasks[0].array is not None
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    loop.cycle()
    orders = heartbeat(cp).start
    heartbeat(cp, replicas=[running(o.assignment_id) for o in orders])
    started = {o.job_id for o in orders}
    assert started  # some run: they are cancelled through their stop order
    done = BulkService(cp).apply(
        ADMIN,
        BulkAction.CANCEL,
        Selection(ids=(tasks[0].array.array_id, "000000000000")),
    )
    assert sorted(c.id for c in done.changed) == sorted(t.id for t in tasks)
    states = {c.id: c.state for c in done.changed}
    assert {states[i] for i in started} == {"COMPLETING"}
    assert done.not_found == ["000000000000"]
    # Named again: all ended now, so cancel leaves them alone and says so.
    again = BulkService(cp).apply(ADMIN, BulkAction.HOLD, Selection(ids=(tasks[1].id,)))
    assert again.changed == []
    assert [(c.id, c.state) for c in again.skipped] == [(tasks[1].id, states[tasks[1].id])]


def test_an_empty_selection_is_refused_and_changes_nothing(cp: ControlPlane) -> None:
    job = submit(cp, "keep")
    with pytest.raises(Invalid, match="nothing to cancel: give job ids or a filter"):
        BulkService(cp).apply(ADMIN, BulkAction.CANCEL, Selection())
    assert _state(cp, job.id) is JobState.PENDING
