"""The scheduling lease (machinery/leader.py) on SQLite and PostgreSQL, with a manual clock: it
expires unless renewed, a standby takes an expired one with a new epoch, and a leader whose
lease passed while it held a decision commits nothing and steps down."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from gpupool.control.bootstrap import bootstrap
from gpupool.control.context import ControlPlane
from gpupool.control.errors import NotLeader
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.leader import Leadership
from gpupool.control.machinery.loop import SchedulingLoop, default_schedule
from gpupool.control.settings import ServerSettings
from gpupool.scheduling.config import SchedulerConfig
from gpupool.scheduling.decision import Decision
from gpupool.scheduling.memo import SchedulerMemo
from gpupool.scheduling.snapshot import ClusterSnapshot
from gpupool.store.db import make_engine
from gpupool.store.models import AssignmentModel, LeaderModel
from tests.control.builders import register, submit
from tests.store.fixtures import _empty_pg


def _standby(cp: ControlPlane) -> ControlPlane:
    return ControlPlane(cp.settings, clock=cp.clock)


def test_a_lease_is_kept_by_renewal_and_taken_over_once_it_expires(
    cp: ControlPlane, clock: ManualClock
) -> None:
    lease = cp.settings.leader_lease_s
    leader = Leadership(cp)
    assert leader.try_acquire()
    first = cp.epoch
    other = _standby(cp)
    standby = Leadership(other)
    try:
        clock.advance(lease * 0.6)
        assert leader.try_acquire()  # older than half a lease: renewed
        clock.advance(lease * 0.6)  # past the first expiry, within the renewed one
        assert not standby.try_acquire()
        clock.advance(lease)  # the leader froze: nothing renewed it
        assert standby.try_acquire()
        assert other.epoch == first + 1
        assert not leader.try_acquire()  # the old leader finds the row moved on
        assert cp.epoch == 0
        with cp.read() as s:
            row = s.get(LeaderModel, 1)
            assert row is not None
            assert (row.epoch, row.holder) == (other.epoch, other.settings.server_id)
    finally:
        standby.release()
        other.close()


def test_a_leader_that_stops_cleanly_hands_over_at_once(cp: ControlPlane) -> None:
    leader = Leadership(cp)
    assert leader.try_acquire()
    other = _standby(cp)
    standby = Leadership(other)
    try:
        assert not standby.try_acquire()
        leader.release()
        assert standby.try_acquire()  # no need to wait for the lease to run out
    finally:
        standby.release()
        other.close()


def test_a_leader_whose_lease_passed_mid_cycle_commits_nothing_and_steps_down(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp)
    submit(cp)
    other = _standby(cp)
    standby = Leadership(other)
    real = default_schedule()

    def frozen_while_deciding(
        snapshot: ClusterSnapshot, config: SchedulerConfig, memo: SchedulerMemo
    ) -> Decision:
        decision = real(snapshot, config, memo)
        clock.advance(cp.settings.leader_lease_s + 1)  # frozen with the decision in hand
        assert standby.try_acquire()
        return decision

    loop = SchedulingLoop(cp, schedule=frozen_while_deciding)
    try:
        assert loop.leadership.try_acquire()
        with pytest.raises(NotLeader):
            loop.cycle()
        with cp.read() as s:
            assert s.scalar(select(func.count()).select_from(AssignmentModel)) == 0
        assert not loop.leadership.try_acquire()
        assert cp.epoch == 0
        assert other.epoch > 0
    finally:
        standby.release()
        other.close()


@pytest.mark.postgres
def test_a_leader_frozen_inside_a_transaction_on_postgres_is_replaced(
    pg_database: str, tmp_path: Path, clock: ManualClock
) -> None:
    """A leader stopped mid-commit holds the leader row's lock; PostgreSQL ends its idle
    session, so the standby's take-over goes through instead of waiting for ever."""
    _empty_pg(pg_database)
    settings = ServerSettings(home=tmp_path / "home", database_url=pg_database, schedule=False)
    frozen_engine = make_engine(pg_database, idle_in_transaction_s=1.0)
    leader = ControlPlane(settings, clock=clock, engine=frozen_engine)
    leader.prepare()
    bootstrap(leader)
    standby = ControlPlane(settings, clock=clock)
    try:
        assert Leadership(leader).try_acquire()
        conn = frozen_engine.connect()
        conn.begin()
        check = select(LeaderModel.epoch).where(LeaderModel.id == 1).with_for_update()
        assert conn.execute(check).scalar() == leader.epoch  # mid-commit: the row is locked
        clock.advance(settings.leader_lease_s + 1)  # ...and then the process froze
        assert Leadership(standby).try_acquire()  # waits for PostgreSQL to end that session
        assert standby.epoch == leader.epoch + 1
        with pytest.raises(DBAPIError):  # the frozen leader's commit fails when it wakes
            conn.execute(check)
        conn.close()
    finally:
        standby.close()
        leader.close()
