"""The notifier without a server: which transitions are told, retries with backoff, counted
failures, and ``post`` never waiting for the network."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from gpupool.control import notify
from gpupool.control.notify import NOTICES, Notice, Notifier, note
from gpupool.control.settings import ServerSettings
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.states import JobState
from gpupool.domain.transitions import transition
from gpupool.metrics.definitions import NOTIFICATIONS


def settings(tmp_path: Path) -> ServerSettings:
    return ServerSettings(home=tmp_path, database_url="sqlite://", mail_webhook="http://h/x")


def moved(job: Job, *states: JobState, session: Session) -> Job:
    for state in states:
        job, _ = transition(job, state, now=100.0, exit_code=0 if state.is_terminal else None)
        note(session, job)
    return job


def job(types: tuple[str, ...]) -> Job:
    spec = JobSpec(name="train", command=("x",), mail_type=types, mail_user="a@example.org")
    return Job(id="j1", spec=spec, tenant="t", user="ann", priority=500)


def test_an_end_followed_by_a_requeue_is_told_as_the_requeue_only() -> None:
    session = Session()
    moved(
        job(("BEGIN", "END", "FAIL", "REQUEUE")),
        JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING, JobState.PREEMPTED,
        JobState.REQUEUED,
        session=session,
    )  # fmt: skip
    assert [n.event for n in session.info[NOTICES]] == ["BEGIN", "REQUEUE"]


def test_an_end_asked_for_alone_is_not_told_when_the_job_is_requeued() -> None:
    session = Session()
    moved(
        job(("END",)),
        JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING, JobState.PREEMPTED,
        JobState.REQUEUED,
        session=session,
    )  # fmt: skip
    assert session.info[NOTICES] == []


def _notice() -> Notice:
    return Notice("j1", "train", "ann", "t", "END", "COMPLETED", 0, None, None, 1.0, "http://h/x")


def test_a_failing_send_is_retried_with_backoff_then_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "FIRST_BACKOFF_S", 0.01)
    tries: list[float] = []
    done = threading.Event()

    def send(_: Notice) -> None:
        tries.append(time.monotonic())
        if len(tries) == notify.ATTEMPTS:
            done.set()
        raise OSError("connection refused")

    failed = NOTIFICATIONS.labels("webhook", "failed")
    before = failed._value.get()
    notifier = Notifier(settings(tmp_path), send=send)
    notifier.post([_notice()])
    assert done.wait(30)
    notifier.close()
    assert len(tries) == notify.ATTEMPTS
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(later >= 0.01 * 2**i * 0.9 for i, later in enumerate(gaps))  # doubling waits
    assert failed._value.get() == before + 1


def test_post_returns_while_a_send_hangs(tmp_path: Path) -> None:
    release = threading.Event()
    sent: list[str] = []

    def send(notice: Notice) -> None:
        release.wait(30)
        sent.append(notice.job_id)

    notifier = Notifier(settings(tmp_path), send=send)
    notifier.post([_notice()])
    notifier.post([_notice()])  # the first send is stuck; queuing the second does not wait
    assert sent == []
    release.set()
    notifier.close()
    assert sent == ["j1", "j1"]


def test_a_job_without_mail_user_goes_to_the_servers_webhook(tmp_path: Path) -> None:
    sent: list[str] = []
    session = Session()
    spec = JobSpec(name="train", command=("x",), mail_type=("BEGIN",))
    moved(
        Job(id="j2", spec=spec, tenant="t", user="ann", priority=500),
        JobState.CONFIGURING, JobState.RUNNING,
        session=session,
    )  # fmt: skip
    notifier = Notifier(settings(tmp_path), send=lambda n: sent.append(n.to))
    notifier.post(session.info[NOTICES])
    notifier.close()
    assert sent == ["http://h/x"]  # --mail-webhook of settings()
