"""End to end: two ``gpupool server`` processes on one store (SQLite and PostgreSQL), the leader
frozen with SIGSTOP past its lease. The standby must take over and start a job submitted while
the leader is frozen; the old leader, resumed with SIGCONT, must commit nothing and become a
standby (fenced by the epoch, see control/machinery/leader.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from gpupool.store.models import AssignmentModel, LeaderModel
from tests.api.server_proc import ServerProcess
from tests.e2e.pool import wait_for
from tests.store.fixtures import db_url, pg_database

__all__ = ["db_url", "pg_database"]

LEASE_S = 3.0
#: A job that runs until its go-file exists (so the test ends it without killing anything).
HOLD = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.1)\n"


def _leads(server: ServerProcess) -> str | None:
    try:
        r = httpx.get(server.url + "/readyz", timeout=2)
    except httpx.HTTPError:
        return None
    return str(r.json().get("leader")) if r.status_code == 200 else None


class Replicas:
    """Two servers on ``url`` (a leader and a standby) and one agent that talks to the standby."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        args = ("--leader-lease", str(LEASE_S), "--heartbeat", "0.5")
        self.a = ServerProcess(root / "a" / "home", database_url=url, extra_args=args)
        self.b = ServerProcess(root / "b" / "home", database_url=url, extra_args=args)
        self.agent: subprocess.Popen[bytes] | None = None
        self.state_dir = root / "agent"
        self.http: httpx.Client | None = None
        self.names: list[str] = []

    def start(self) -> None:
        self.a.start()
        wait_for(lambda: _leads(self.a) == "yes", 60, "server a to lead")
        self.b.start()
        token = self.a.admin_token()
        self.http = httpx.Client(timeout=20, headers={"Authorization": f"Bearer {token}"})
        self.post(self.b, "/v1/users", {"name": "lease-agent", "role": "agent"})
        secret = self.post(self.b, "/v1/tokens", {"user": "lease-agent", "name": "t"})["secret"]
        token_file = self.root / "agent-token"
        token_file.write_text(secret)
        log = open(self.root / "agent.log", "ab")  # noqa: SIM115 - the child owns it
        self.agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpupool.cli",
                "agent",
                "--server",
                self.b.url,
                "--token-file",
                str(token_file),
                "--simulate",
                "2xA100-80GB",
                "--node",
                "n1",
                "--state-dir",
                str(self.state_dir),
                "--address",
                "127.0.0.1",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_for(self.node_up, 60, "agent n1 up")

    def node_up(self) -> bool:
        assert self.http is not None
        r = self.http.get(self.b.url + "/v1/nodes/n1")
        return r.status_code == 200 and r.json()["state"] == "up"

    def post(self, server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
        assert self.http is not None
        r = self.http.post(server.url + path, json=body)
        assert r.status_code < 300, f"{path}: {r.status_code} {r.text}"
        return r.json()

    def submit(self, server: ServerProcess, name: str) -> str:
        self.names.append(name)
        go = str(self.root / f"{name}.go")
        spec = {"name": name, "command": [sys.executable, "-c", HOLD, go]}
        spec["resources"] = {"gpus": "1"}
        return str(self.post(server, "/v1/jobs", {"spec": spec})["job"]["id"])

    def state(self, job_id: str) -> str:
        assert self.http is not None
        return str(self.http.get(f"{self.b.url}/v1/jobs/{job_id}").json()["state"])

    def close(self) -> None:
        for server in (self.a, self.b):
            if server.proc is not None and server.proc.poll() is None:
                with contextlib.suppress(OSError):
                    server.proc.send_signal(signal.SIGCONT)
        for name in self.names:
            (self.root / f"{name}.go").touch()
        if self.agent is not None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.agent.kill()
        for state in self.state_dir.glob("jobs/*/state.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(state.read_text())
                for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                    if data.get(key):
                        with contextlib.suppress(OSError):
                            kill(int(data[key]), signal.SIGKILL)
        self.a.stop()
        self.b.stop()
        if self.http is not None:
            self.http.close()


@pytest.fixture
def replicas(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    pair = Replicas(tmp_path, db_url)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


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
    assert _leads(pair.b) == "no"
    first_epoch = _leader_epoch(pair.url)
    assert pair.a.proc is not None
    pair.a.proc.send_signal(signal.SIGSTOP)  # frozen: no renewal, no exit, its sockets open
    try:
        frozen_job = pair.submit(pair.b, "while-frozen")
        wait_for(lambda: pair.state(frozen_job) == "RUNNING", 90, "the job to start")
        assert _leads(pair.b) == "yes"
        new_epoch = _leader_epoch(pair.url)
        assert new_epoch > first_epoch
    finally:
        pair.a.proc.send_signal(signal.SIGCONT)
    # The old leader wakes with its lease long gone: it steps down instead of leading.
    wait_for(lambda: _leads(pair.a) == "no", 60, "the resumed server to step down")
    assert "stepping down" in pair.a.tail(200)
    # A job submitted through the old leader is started once, by the new one.
    later_job = pair.submit(pair.a, "after-wake")
    wait_for(lambda: pair.state(later_job) == "RUNNING", 90, "the later job to start")
    assert _leads(pair.b) == "yes"
    assert _leads(pair.a) == "no"
    rows = _assignments(pair.url)
    assert sorted(j for j, _ in rows) == sorted([frozen_job, later_job]), rows  # one each
    assert {e for _, e in rows} == {new_epoch}, "an assignment from the deposed epoch"
    assert _leader_epoch(pair.url) == new_epoch
    for name in ("while-frozen", "after-wake"):
        (pair.root / f"{name}.go").write_text("")
    for job_id in (frozen_job, later_job):
        wait_for(lambda j=job_id: pair.state(j) == "COMPLETED", 60, f"job {job_id} to finish")


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
        wait_for(lambda: _leads(pair.b) == "yes", 45, "the standby to take over")
        wait_for(lambda: pair.state(job) == "RUNNING", 60, "the job to start")
        assert _leader_epoch(pair.url) > first_epoch
        assert "held the lapsed scheduling lease" in pair.b.tail(400)
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")  # its session was ended: the commit it held is gone
    finally:
        with contextlib.suppress(psycopg.Error):
            holder.close()
        pair.a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: _leads(pair.a) == "no", 60, "the resumed server to step down")
    (pair.root / "behind-a-frozen-commit.go").write_text("")
    wait_for(lambda: pair.state(job) == "COMPLETED", 60, "the job to finish")
