"""Job notifications (sbatch ``--mail-type`` / ``--mail-user``): e-mail or webhook, sent off the
scheduling path, kept in the store until sent ("nothing acknowledged is ever lost").

How a notice travels:

1. **noted** in the transaction that moves the job: :func:`note`, called by
   :func:`gpupool.control.machinery.jobstate.move` for every transition, keeps a
   :class:`Notice` in ``session.info`` when the job asked for this moment
   (:func:`gpupool.domain.mail.mail_event`). Notices of one job in one transaction are merged:
   an end followed by its requeue is told as the requeue.
2. **staged** in that same transaction, just before it commits:
   :meth:`gpupool.control.context.ControlPlane.tx` calls :func:`stage`, which writes the
   transaction's notices to the outbox table ``notices`` in one INSERT
   (:mod:`gpupool.control.outbox`). They exist if and only if the job's move committed: a
   rolled-back move tells nothing, and a server killed right after the commit loses nothing.
   A notice with no ``--mail-user`` is addressed to the server's ``--mail-webhook`` here.
3. **woken**: after the commit, ``tx`` wakes this process's sender (:meth:`Notifier.wake`); on
   PostgreSQL the transaction also sends its origin on :data:`NOTICES_CHANNEL` (delivered on
   commit), which wakes the senders of the other replicas (:mod:`gpupool.store.notify`).
4. **sent** by one sender thread per server process (:class:`Notifier`, started with the
   server): it claims due rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two replicas
   never both send one; SQLite has one writer), sends each outside any transaction, and
   deletes it once sent. An e-mail goes through the server's SMTP host (``--smtp-host``,
   ``--smtp-port``, ``--smtp-from``, ``--smtp-starttls``) to a ``--mail-user`` address; a
   webhook gets a JSON POST to the ``--mail-user`` URL (else the server's ``--mail-webhook``).
   A failed send is put back with a doubling backoff (1 s, 2 s, 4 s, ... ``MAX_BACKOFF_S``) up
   to ``ATTEMPTS`` times, then deleted; every outcome is logged and counted in
   ``gpupool_notifications_total{channel, outcome}`` (``sent``, ``retried``, ``failed``).
5. **resumed**: a server that starts sends what the outbox holds. Rows claimed by a process
   that died are sent again: at once when it ran on this host (a server killed mid-send and
   restarted), else when its claim's lease ends (``outbox.LEASE_S``).

Idle, the sender sleeps until woken or until the next retry is due: no polling. Delivery is at
least once: a send that reached the receiver when its server died before deleting the row is
sent again (same ``job_id``, ``event`` and ``time``: a receiver may drop the repeat).
:func:`check_submit` refuses at submit what could never be sent (an address with no SMTP host,
mail types with nowhere to go), naming the setting to change.

The webhook's body: ``{"job_id", "name", "user", "tenant", "event", "state", "exit_code",
"signal", "reason", "time"}`` (``event`` is the mail type: BEGIN, END, FAIL or REQUEUE).
"""

from __future__ import annotations

import logging
import smtplib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from typing import Any

from sqlalchemy.orm import Session

from gpupool.control import outbox
from gpupool.control.settings import ServerSettings
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.mail import is_webhook, mail_event
from gpupool.domain.states import JobState
from gpupool.metrics.definitions import NOTIFICATIONS

log = logging.getLogger("gpupool.notify")

#: ``session.info`` key of the notices a transaction made.
NOTICES = "gpupool.notices"
#: The PostgreSQL channel a server announces its committed notices on (payload: its origin).
NOTICES_CHANNEL = "gpupool_notices"
ATTEMPTS = 6
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
SEND_TIMEOUT_S = 10.0
#: The sender's shortest sleep when a due row is held by another process's claim transaction.
IDLE_FLOOR_S = 0.1


@dataclass(frozen=True)
class Notice:
    """One moment of one job to tell ``to`` (an address or a URL; empty: the server's
    webhook, filled in by :meth:`Notifier.post`)."""

    job_id: str
    name: str
    user: str
    tenant: str
    event: str
    state: str
    exit_code: int | None
    signal: str | None
    reason: str | None
    time: float
    to: str

    @property
    def channel(self) -> str:
        return "webhook" if is_webhook(self.to) else "email"

    def payload(self) -> dict[str, Any]:
        data = asdict(self)
        del data["to"]
        return data

    def subject(self) -> str:
        """Like Slurm's: ``gpupool Job_id=12 Name=train Ended, COMPLETED, ExitCode 0``."""
        verb = {"BEGIN": "Began", "END": "Ended", "FAIL": "Failed", "REQUEUE": "Requeued"}
        text = f"gpupool Job_id={self.job_id} Name={self.name} {verb[self.event]}, {self.state}"
        if self.exit_code is not None:
            text += f", ExitCode {self.exit_code}"
        return text


def destination(spec: JobSpec, webhook: str | None) -> str | None:
    """Where a job's notices go: its ``mail_user``, else the server's webhook, else nowhere."""
    return spec.mail_user if spec.mail_user is not None else webhook


def check_submit(spec: JobSpec, settings: ServerSettings) -> str | None:
    """Why a job's notices could never be sent on this server (the setting to change), else
    ``None``."""
    if not spec.mail_type:
        return None
    to = destination(spec, settings.mail_webhook)
    if to is None:
        return (
            "--mail-type needs --mail-user (an e-mail address or an https:// URL): this server "
            "has no default webhook (an admin sets it with gpupool server --mail-webhook URL)"
        )
    if not is_webhook(to) and settings.smtp_host is None:
        return (
            f"--mail-user {to} is an e-mail address, and this server has no SMTP host to send "
            "it through: an admin sets gpupool server --smtp-host HOST (and --smtp-port, "
            "--smtp-from), or give --mail-user an https:// URL for a webhook"
        )
    return None


def note(session: Session, job: Job) -> None:
    """Keep a notice of ``job``'s new state in ``session`` when the job asked for it (sent to
    its ``mail_user``; one without is sent to the server's webhook by :meth:`Notifier.post`)."""
    spec = job.spec
    if not spec.mail_type:
        return
    event = mail_event(spec.mail_type, job.state)
    notices: list[Notice] = session.info.setdefault(NOTICES, [])
    if job.state is JobState.REQUEUED:  # it did not end after all: told as the requeue, if asked
        notices[:] = [n for n in notices if n.job_id != job.id or n.event == "BEGIN"]
    if event is None:
        return
    notices.append(
        Notice(
            job_id=job.id,
            name=spec.name,
            user=job.user,
            tenant=job.tenant,
            event=event,
            state=job.state.value,
            exit_code=job.exit_code,
            signal=job.signal,
            reason=job.reason,
            time=_when(job, event),
            to=spec.mail_user or "",
        )
    )


def _when(job: Job, event: str) -> float:
    moment = job.start_time if event == "BEGIN" else job.end_time
    return moment if moment is not None else time.time()


Sender = Callable[[Notice], None]
#: Opens a transaction on the store (:meth:`gpupool.control.context.ControlPlane.tx`).
Transactions = Callable[[], AbstractContextManager[Session]]


def stage(session: Session, webhook: str | None) -> bool:
    """Write the notices :func:`note` kept in ``session`` to the outbox, in its transaction
    (one INSERT); a notice with no ``to`` goes to ``webhook``. True when any was written."""
    notices: list[Notice] = session.info.pop(NOTICES, None) or []
    rows: list[dict[str, Any]] = []
    for notice in notices:
        to = notice.to or webhook
        if to is None:  # refused at submit; the setting went since
            log.warning("notification of job %s: nowhere to send", notice.job_id)
            continue
        rows.append({"job_id": notice.job_id, "recipient": to, "body": notice.payload()})
    if rows:
        outbox.stage(session, rows, time.time())
    return bool(rows)


class Notifier:
    """The sender thread of one server process (see the module docstring): claims due rows of
    the outbox, sends them, deletes them or puts them back for a retry, and sleeps until woken
    (:meth:`wake`) or until the next row is due."""

    def __init__(
        self, settings: ServerSettings, tx: Transactions, *, send: Sender | None = None
    ) -> None:
        self.settings = settings
        self.owner = outbox.owner_name()
        self._tx = tx
        self._send = send or self._deliver
        self._cond = threading.Condition()
        self._woken = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sender: it first sends what the store holds (a restart resumes)."""
        with self._cond:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """New rows were committed (here, or by another replica): look now. Never blocks."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sender after the send in progress (``timeout`` at most); what is left stays
        in the outbox for the next start or another replica."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if thread is None or not thread.is_alive():  # a send still under way keeps its claims
            outbox.retire(self.owner)

    def _run(self) -> None:
        try:
            with self._tx() as session:
                freed = outbox.release_dead(session, time.time())
            if freed:
                log.info("%d notifications claimed by a process that died: sent again", freed)
        except Exception as exc:  # the store is down: its claims expire by themselves
            log.warning("could not look for notifications of dead processes: %s", exc)
        trouble = FIRST_BACKOFF_S
        while True:
            with self._cond:
                if self._closed:
                    return
                self._woken = False
            try:
                if self._round():
                    trouble = FIRST_BACKOFF_S
                    continue  # there may be more
                with self._tx() as session:
                    due = outbox.next_due(session)
                trouble = FIRST_BACKOFF_S
            except Exception as exc:  # the store is down or busy: try again later
                log.warning("notifications: %s; trying again in %gs", exc, trouble)
                due = time.time() + trouble
                trouble = min(trouble * 2, MAX_BACKOFF_S)
            with self._cond:
                if self._woken or self._closed:
                    continue
                # a row due but not claimable is another process's, in its claim transaction
                self._cond.wait(None if due is None else max(due - time.time(), IDLE_FLOOR_S))

    def _round(self) -> bool:
        """Claim and send one batch; False when nothing was due."""
        with self._tx() as session:
            batch = outbox.claim(session, self.owner, time.time())
        for i, row in enumerate(batch):
            if self._closed:  # stopping: the rest goes back to the outbox, untried
                with self._tx() as session:
                    for rest in batch[i:]:
                        outbox.retry(session, self.owner, rest.id, rest.attempts, 0.0)
                return True
            self._attempt(row)
        return bool(batch)

    def _attempt(self, row: outbox.Claimed) -> None:
        try:
            notice = Notice(**row.body, to=row.recipient)
        except TypeError as exc:  # a row this release cannot read: dropped, not retried forever
            log.error("notification row %d unreadable, dropped: %s (%r)", row.id, exc, row.body)
            with self._tx() as session:
                outbox.done(session, self.owner, row.id)
            NOTIFICATIONS.labels(
                "webhook" if is_webhook(row.recipient) else "email", "failed"
            ).inc()
            return
        attempt = row.attempts + 1
        try:
            self._send(notice)
        except Exception as exc:  # any failure of the network or the receiver: retry
            if attempt >= ATTEMPTS:
                log.warning(
                    "notification %s of job %s to %s failed %d times, dropped: %s",
                    notice.event, notice.job_id, notice.to, attempt, exc,
                )  # fmt: skip
                with self._tx() as session:
                    outbox.done(session, self.owner, row.id)
                NOTIFICATIONS.labels(notice.channel, "failed").inc()
                return
            backoff = min(FIRST_BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S)
            log.info("notification of job %s to %s: %s; retry in %gs", notice.job_id,
                     notice.to, exc, backoff)  # fmt: skip
            with self._tx() as session:
                outbox.retry(session, self.owner, row.id, attempt, time.time() + backoff)
            NOTIFICATIONS.labels(notice.channel, "retried").inc()
            return
        with self._tx() as session:
            outbox.done(session, self.owner, row.id)
        NOTIFICATIONS.labels(notice.channel, "sent").inc()

    def _deliver(self, notice: Notice) -> None:
        if notice.channel == "webhook":
            import httpx

            answer = httpx.post(notice.to, json=notice.payload(), timeout=SEND_TIMEOUT_S)
            answer.raise_for_status()
            return
        settings = self.settings
        if settings.smtp_host is None:  # refused at submit; the setting went since
            raise RuntimeError("no SMTP host: set gpupool server --smtp-host")
        message = EmailMessage()
        message["From"] = settings.smtp_from
        message["To"] = notice.to
        message["Subject"] = notice.subject()
        message.set_content(
            "\n".join(f"{k}: {'' if v is None else v}" for k, v in notice.payload().items()) + "\n"
        )
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=SEND_TIMEOUT_S) as smtp:
            if settings.smtp_starttls:
                smtp.starttls()
            smtp.send_message(message)
