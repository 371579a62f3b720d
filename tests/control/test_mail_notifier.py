"""The notifier and its outbox on a store (SQLite and PostgreSQL), without a server: which
transitions are told, notices written only by a committed transaction, retries with backoff,
counted failures, two senders on one store sending each notice once, claims of a dead process
sent again, and what a stopped sender leaves in the outbox. (The user's path, a real server
killed mid-send and two real replicas: tests/e2e/test_notify_durable.py.)"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session

from gpupool.control import notify, outbox
from gpupool.control.context import ControlPlane
from gpupool.control.notify import NOTICES, Notice, Notifier, note
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.states import JobState
from gpupool.domain.transitions import transition
from gpupool.metrics.definitions import NOTIFICATIONS
from gpupool.store.models import NoticeModel
from tests.e2e.pool import wait_for


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


def _notice(job_id: str = "j1", to: str = "http://h/x") -> Notice:
    return Notice(job_id, "train", "ann", "t", "END", "COMPLETED", 0, None, None, 1.0, to)


def _commit(cp: ControlPlane, *notices: Notice) -> None:
    """A transaction that noted ``notices`` (as ``move`` does) and committed."""
    with cp.tx() as session:
        session.info.setdefault(NOTICES, []).extend(notices)


def _outbox(cp: ControlPlane) -> int:
    with cp.read() as session:
        return int(session.scalar(select(func.count()).select_from(NoticeModel)) or 0)


def _sender(cp: ControlPlane, send: notify.Sender) -> Notifier:
    sender = Notifier(cp.settings, cp.tx, send=send)
    sender.start()
    return sender


def test_a_committed_transaction_keeps_its_notices_and_a_rolled_back_one_none(
    cp: ControlPlane,
) -> None:
    def failed_move() -> None:
        with cp.tx() as session:
            session.info.setdefault(NOTICES, []).append(_notice("lost"))
            raise RuntimeError("the move failed")

    with pytest.raises(RuntimeError):
        failed_move()
    assert _outbox(cp) == 0
    _commit(cp, _notice("j1"), _notice("j2", to=""))  # no --mail-user: the server's webhook
    with cp.read() as session:
        rows = session.execute(select(NoticeModel.job_id, NoticeModel.recipient)).all()
    assert sorted(tuple(r) for r in rows) == [("j1", "http://h/x"), ("j2", "http://h/x")]


def test_a_transaction_noting_several_notices_writes_them_in_one_insert(
    cp: ControlPlane,
) -> None:
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(cp.engine, "before_cursor_execute", seen)
    try:
        _commit(cp, _notice("j1"), _notice("j2"), _notice("j3"))
        _commit(cp)  # a transaction that noted nothing writes nothing to the outbox
    finally:
        event.remove(cp.engine, "before_cursor_execute", seen)
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT INTO NOTICES")]
    assert len(inserts) == 1, inserts
    assert _outbox(cp) == 3


def test_a_failing_send_is_retried_with_backoff_then_dropped_and_counted(
    cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "FIRST_BACKOFF_S", 0.05)
    tries: list[float] = []
    done = threading.Event()

    def send(_: Notice) -> None:
        tries.append(time.time())
        if len(tries) == notify.ATTEMPTS:
            done.set()
        raise OSError("connection refused")

    failed = NOTIFICATIONS.labels("webhook", "failed")
    before = failed._value.get()
    sender = _sender(cp, send)
    try:
        _commit(cp, _notice())
        sender.wake()
        assert done.wait(60)
        wait_for(lambda: _outbox(cp) == 0, 30, "the failed notice to leave the outbox")
    finally:
        sender.close()
    assert len(tries) == notify.ATTEMPTS
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(later >= 0.05 * 2**i * 0.9 for i, later in enumerate(gaps))  # doubling waits
    assert failed._value.get() == before + 1


def test_two_senders_on_one_store_send_each_notice_once(cp: ControlPlane) -> None:
    sent: list[str] = []
    lock = threading.Lock()

    def send(notice: Notice) -> None:
        time.sleep(0.002)  # a network call: the other sender claims meanwhile
        with lock:
            sent.append(notice.job_id)

    senders = [_sender(cp, send), _sender(cp, send)]
    try:
        for batch in range(10):
            _commit(cp, *(_notice(f"j{batch}-{i}") for i in range(10)))
            for sender in senders:
                sender.wake()
        wait_for(lambda: len(sent) >= 100 and _outbox(cp) == 0, 60, "100 notices sent")
    finally:
        for sender in senders:
            sender.close()
    assert Counter(sent) == Counter(f"j{b}-{i}" for b in range(10) for i in range(10))


def test_a_claim_of_a_dead_process_on_this_host_is_sent_by_the_next_sender(
    cp: ControlPlane,
) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    _commit(cp, _notice("dead"), _notice("live"), _notice("far"))
    owners = {
        "dead": f"{host}:{gone.stdout.strip()}:beef",  # a process that exited
        "live": f"{host}:{os.getppid()}:cafe",  # a process that runs
        "far": "elsewhere:1:f00d",  # another machine's: its lease decides
    }
    with cp.tx() as session:
        for job_id, owner in owners.items():
            session.execute(
                update(NoticeModel)
                .where(NoticeModel.job_id == job_id)
                .values(claimed_by=owner, claimed_until=time.time() + outbox.LEASE_S)
            )
    sent: list[str] = []
    sender = _sender(cp, lambda n: sent.append(n.job_id))
    try:
        wait_for(lambda: sent == ["dead"] or None, 30, "the dead process's notice")
        wait_for(lambda: _outbox(cp) == 2, 30, "the sent row deleted")
        time.sleep(0.5)  # the live and far claims stay theirs
        assert sent == ["dead"]
    finally:
        sender.close()


def test_a_sender_starting_beside_a_live_one_in_this_process_leaves_its_claims(
    cp: ControlPlane,
) -> None:
    entered = threading.Event()
    release = threading.Event()
    sent: list[str] = []

    def slow(notice: Notice) -> None:
        entered.set()
        release.wait(30)
        sent.append(notice.job_id)

    first = _sender(cp, slow)
    second: Notifier | None = None
    try:
        _commit(cp, _notice("j1"))
        first.wake()
        assert entered.wait(30)  # claimed by the first, its send under way
        second = _sender(cp, lambda n: sent.append(f"second {n.job_id}"))
        second.wake()
        time.sleep(0.5)  # the second looked: the claim is a live sender's
        release.set()
        wait_for(lambda: _outbox(cp) == 0, 30, "the notice sent")
    finally:
        release.set()
        for sender in (first, second):
            if sender is not None:
                sender.close()
    assert sent == ["j1"]


def test_a_stopped_sender_leaves_what_it_did_not_send_in_the_outbox(cp: ControlPlane) -> None:
    release = threading.Event()
    entered = threading.Event()
    sent: list[str] = []

    def send(notice: Notice) -> None:
        entered.set()
        release.wait(30)
        sent.append(notice.job_id)

    sender = _sender(cp, send)
    _commit(cp, _notice("j1"), _notice("j2"), _notice("j3"))
    sender.wake()
    assert entered.wait(30)
    closing = threading.Thread(target=sender.close, kwargs={"timeout": 30})
    closing.start()
    release.set()
    closing.join(60)
    assert sent == ["j1"]
    assert _outbox(cp) == 2  # j2 and j3, unclaimed for the next start
    later: list[str] = []
    again = _sender(cp, lambda n: later.append(n.job_id))
    try:
        wait_for(lambda: _outbox(cp) == 0, 30, "the next sender to send the rest")
    finally:
        again.close()
    assert later == ["j2", "j3"]


def test_a_job_without_mail_user_goes_to_the_servers_webhook(cp: ControlPlane) -> None:
    sent: list[str] = []
    spec = JobSpec(name="train", command=("x",), mail_type=("BEGIN",))
    sender = _sender(cp, lambda n: sent.append(n.to))
    try:
        with cp.tx() as session:
            moved(
                Job(id="j2", spec=spec, tenant="t", user="ann", priority=500),
                JobState.CONFIGURING, JobState.RUNNING,
                session=session,
            )  # fmt: skip
        sender.wake()  # as the control plane wakes its own after the commit
        wait_for(lambda: sent or None, 30, "the notice")
    finally:
        sender.close()
    assert sent == [cp.settings.mail_webhook]


@pytest.fixture
def cp(cp: ControlPlane) -> ControlPlane:
    """The store's control plane with a server webhook (``http://h/x``)."""
    cp.settings = replace(cp.settings, mail_webhook="http://h/x")
    return cp


def test_a_row_this_release_cannot_read_is_dropped_and_counted_not_retried(
    cp: ControlPlane,
) -> None:
    with cp.tx() as session:
        outbox.stage(session, [{"job_id": "j9", "recipient": "http://h/x", "body": {"x": 1}}], 1.0)
    failed = NOTIFICATIONS.labels("webhook", "failed")
    before = failed._value.get()
    sent: list[str] = []
    sender = _sender(cp, lambda n: sent.append(n.job_id))
    try:
        wait_for(lambda: _outbox(cp) == 0, 30, "the unreadable row dropped")
    finally:
        sender.close()
    assert sent == []
    assert failed._value.get() == before + 1
