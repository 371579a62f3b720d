"""``--mail-type`` notices are kept across a server's death and sent once by two replicas, on
the user's path: real ``gpupool server`` processes and an agent, jobs submitted through the
CLI or the API, notices received by a local webhook (:class:`tests.e2e.sinks.HookSink`).

- a job asks for END notices; its END reaches the webhook, which stalls without answering;
  the server is SIGKILLed then, and started again: the notice arrives, once (it was committed
  with the job's end, in the outbox, and the dead process's claim is freed at the restart);
- two replicas on one store (PostgreSQL and SQLite), jobs submitted through both, BEGIN and
  END of each: every notice arrives exactly once, and the outbox ends empty.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from tests.e2e.pool import PY, Pool, wait_for
from tests.e2e.sinks import HookSink
from tests.e2e.test_leader_lease import LEASE_ARGS
from tests.e2e.test_notify import submit
from tests.e2e.test_restart import _answers, _restart_server
from tests.fleet.replicas import Replicas, running
from tests.store.fixtures import db_url, pg_database

__all__ = ["db_url", "pg_database"]


def _outbox(url: str) -> int:
    """Rows left in the store's notices outbox (by name: the test also runs on old code)."""
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            return int(s.scalar(text("SELECT count(*) FROM notices")) or 0)
    finally:
        engine.dispose()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    with Pool.running(tmp_path, {"n1": "4xA100-80GB"}) as running:
        yield running


def test_an_end_notice_in_flight_when_the_server_is_killed_arrives_once_after_restart(
    pool: Pool,
) -> None:
    with HookSink(stall_first=1) as hook:
        job = submit(
            pool, "-J", "durable", "--mail-type", "END", "--mail-user", hook.url,
            "--", PY, "-c", "print('done')",
        )  # fmt: skip
        assert hook.held.wait(120), "the END notice never reached the webhook"
        assert pool.server is not None
        pool.server.send_signal(signal.SIGKILL)  # mid-send: the webhook has not answered
        pool.server.wait(timeout=30)
        hook.release.set()  # the held POST is dropped unanswered: its sender is gone
        assert [b["event"] for b in hook.stalled] == ["END"]
        assert hook.bodies == []

        _restart_server(pool)
        wait_for(lambda: _answers(pool), 60, "the restarted server to be ready")
        wait_for(lambda: hook.bodies or None, 60, "the END notice after the restart")
        url = f"sqlite:///{pool.home / 'gpupool.db'}"
        wait_for(lambda: _outbox(url) == 0, 60, "the outbox to be empty")
        time.sleep(2)  # a second send would come at once: give it the time to show
        told = list(hook.bodies)
    assert len(told) == 1, told
    end = told[0]
    assert (end["job_id"], end["name"], end["event"], end["state"], end["exit_code"]) == (
        job, "durable", "END", "COMPLETED", 0,
    )  # fmt: skip
    assert pool.job(job)["state"] == "COMPLETED"


@pytest.fixture
def replicas(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    with running(tmp_path, db_url, LEASE_ARGS) as pair:
        yield pair


def test_two_replicas_send_each_notice_once(replicas: Replicas, db_url: str) -> None:
    pair = replicas
    jobs: list[str] = []
    with HookSink(delay_s=0.05) as hook:  # each send takes a while: the replicas overlap
        for i in range(12):
            server = pair.a if i % 2 else pair.b
            spec = {
                "name": f"told{i}",
                "command": [sys.executable, "-c", "pass"],
                "resources": {"gpus": "0.1"},
                "mail_type": ["BEGIN", "END"],
                "mail_user": hook.url,
            }
            jobs.append(str(pair.post(server, "/v1/jobs", {"spec": spec})["job"]["id"]))
        wait_for(
            lambda: all(pair.state(pair.b, j) == "COMPLETED" for j in jobs), 180, "the jobs to end"
        )
        wait_for(lambda: len(hook.bodies) >= 2 * len(jobs), 120, "a BEGIN and an END per job")
        wait_for(lambda: _outbox(db_url) == 0, 60, "the outbox to be empty")
        time.sleep(2)  # a second send of any would come at once: give it the time to show
        told = Counter((b["job_id"], b["event"]) for b in hook.bodies)
    assert told == Counter({(j, e): 1 for j in jobs for e in ("BEGIN", "END")}), told
    sent = [_sent(server.url) for server in (pair.a, pair.b)]
    print(f"webhook notices sent by replica a, b: {sent}")
    assert sum(sent) == 2 * len(jobs), sent  # each counted once, by the replica that sent it


def _sent(url: str) -> int:
    """``gpupool_notifications_total{channel="webhook", outcome="sent"}`` of one server."""
    metrics = httpx.get(f"{url}/metrics", timeout=20).text
    found = re.search(
        r'gpupool_notifications_total\{channel="webhook",outcome="sent"\} (\S+)', metrics
    )
    return int(float(found.group(1))) if found else 0
