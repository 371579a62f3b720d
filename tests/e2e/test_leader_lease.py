"""End to end: two ``gpupool server`` processes on one store (SQLite and PostgreSQL), the leader
frozen with SIGSTOP past its lease. The standby must take over and start a job submitted while
the leader is frozen; the old leader, resumed with SIGCONT, must commit nothing and become a
standby (fenced by the epoch, see control/machinery/leader.py)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gpupool.store.models import AssignmentModel, LeaderModel
from tests.e2e.pool import wait_for
from tests.fleet.replicas import Replicas, leads, running
from tests.store.fixtures import db_url, pg_database

__all__ = ["db_url", "pg_database"]

LEASE_S = 3.0
#: The servers' options: a short lease, so that a frozen leader is replaced within the test.
LEASE_ARGS = ("--leader-lease", str(LEASE_S), "--heartbeat", "0.5")


@pytest.fixture
def replicas(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    """Two servers on ``db_url`` (a leader and a standby) and one agent that talks to the
    standby (tests/fleet/replicas.py)."""
    with running(tmp_path, db_url, LEASE_ARGS) as pair:
        yield pair


def _assignments(url: str) -> list[tuple[str, int]]:
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            rows = s.execute(select(AssignmentModel.job_id, AssignmentModel.epoch)).all()
            return [(str(j), int(e)) for j, e in rows]
    finally:
        engine.dispose()


def _leader_epoch(url: str) -> int:
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            return int(s.scalar(select(func.max(LeaderModel.epoch))) or 0)
    finally:
        engine.dispose()


def test_a_frozen_leader_is_replaced_and_fenced_when_it_wakes(replicas: Replicas) -> None:
    pair = replicas
    assert leads(pair.b) == "no"
    first_epoch = _leader_epoch(pair.url)
    assert pair.a.proc is not None
    pair.a.proc.send_signal(signal.SIGSTOP)  # frozen: no renewal, no exit, its sockets open
    try:
        frozen_job = pair.submit(pair.b, "while-frozen")
        wait_for(lambda: pair.state(pair.b, frozen_job) == "RUNNING", 90, "the job to start")
        assert leads(pair.b) == "yes"
        new_epoch = _leader_epoch(pair.url)
        assert new_epoch > first_epoch
    finally:
        pair.a.proc.send_signal(signal.SIGCONT)
    # The old leader wakes with its lease long gone: it steps down instead of leading.
    wait_for(lambda: leads(pair.a) == "no", 60, "the resumed server to step down")
    assert "stepping down" in pair.a.tail(200)
    # A job submitted through the old leader is started once, by the new one.
    later_job = pair.submit(pair.a, "after-wake")
    wait_for(lambda: pair.state(pair.b, later_job) == "RUNNING", 90, "the later job to start")
    assert leads(pair.b) == "yes"
    assert leads(pair.a) == "no"
    rows = _assignments(pair.url)
    assert sorted(j for j, _ in rows) == sorted([frozen_job, later_job]), rows  # one each
    assert {e for _, e in rows} == {new_epoch}, "an assignment from the deposed epoch"
    assert _leader_epoch(pair.url) == new_epoch
    for name in ("while-frozen", "after-wake"):
        pair.finish(pair.b, name)


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_leader_frozen_inside_its_transaction_is_replaced_within_the_lease(
    replicas: Replicas,
) -> None:
    """A leader frozen while it holds the lease row's lock (inside a scheduling commit or a
    renewal) must not keep the standby waiting for PostgreSQL to end the idle transaction:
    the standby ends that session once the lease has lapsed, takes over and schedules."""
    pair = replicas
    assert pair.a.proc is not None
    first_epoch = _leader_epoch(pair.url)
    # The frozen leader's own session, idle inside a transaction that locked the lease row
    # (named as a server's session is; with no idle-in-transaction limit of its own, so only
    # the standby can end it).
    dsn = make_url(pair.url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder = psycopg.connect(
        dsn,
        application_name="gpupool-server frozen-leader",
        options="-c idle_in_transaction_session_timeout=0",
    )
    try:
        pair.a.proc.send_signal(signal.SIGSTOP)
        holder.execute("SELECT epoch FROM leader WHERE id = 1 FOR UPDATE")
        job = pair.submit(pair.b, "behind-a-frozen-commit")
        # Without the standby ending it, the lock is held until the test lets go (never).
        wait_for(lambda: leads(pair.b) == "yes", 45, "the standby to take over")
        wait_for(lambda: pair.state(pair.b, job) == "RUNNING", 60, "the job to start")
        assert _leader_epoch(pair.url) > first_epoch
        assert "held the lapsed scheduling lease" in pair.b.tail(400)
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")  # its session was ended: the commit it held is gone
    finally:
        with contextlib.suppress(psycopg.Error):
            holder.close()
        pair.a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: leads(pair.a) == "no", 60, "the resumed server to step down")
    pair.finish(pair.b, "behind-a-frozen-commit")
