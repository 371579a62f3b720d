"""Job notifications (sbatch ``--mail-type`` / ``--mail-user``): e-mail or webhook, sent off the
scheduling path.

How a notice travels:

1. **noted** in the transaction that moves the job: :func:`note`, called by
   :func:`gpupool.control.machinery.jobstate.move` for every transition, keeps a
   :class:`Notice` in ``session.info`` when the job asked for this moment
   (:func:`gpupool.domain.mail.mail_event`). Nothing is sent from inside a transaction.
2. **handed over** after the commit: :meth:`gpupool.control.context.ControlPlane.tx` gives the
   transaction's notices to :meth:`Notifier.post` (a rolled-back move tells nothing). Notices of
   one job in one transaction are merged: an end followed by its requeue is told as the requeue.
   ``post`` never blocks: the notices go on an in-memory queue (at most ``MAX_QUEUED``; beyond
   that a notice is dropped, logged and counted as failed).
3. **sent** by one worker thread per server process: an e-mail through the server's SMTP host
   (``--smtp-host``, ``--smtp-port``, ``--smtp-from``, ``--smtp-starttls``) to a ``--mail-user``
   address, or a JSON POST to the ``--mail-user`` URL (else the server's ``--mail-webhook``). A
   failed send is retried with a doubling backoff (1 s, 2 s, 4 s, ... ``MAX_BACKOFF_S``) up to
   ``ATTEMPTS`` times, then dropped; every outcome is logged and counted in
   ``gpupool_notifications_total{channel, outcome}`` (``sent``, ``retried``, ``failed``).

Notices are kept in memory only: a server stopped with notices queued loses them (logged at
close). :func:`check_submit` refuses at submit what could never be sent (an address with no SMTP
host, mail types with nowhere to go), naming the setting to change.

The webhook's body: ``{"job_id", "name", "user", "tenant", "event", "state", "exit_code",
"signal", "reason", "time"}`` (``event`` is the mail type: BEGIN, END, FAIL or REQUEUE).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import smtplib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from email.message import EmailMessage
from typing import Any

from sqlalchemy.orm import Session

from gpupool.control.settings import ServerSettings
from gpupool.domain.jobs import Job, JobSpec
from gpupool.domain.mail import is_webhook, mail_event
from gpupool.domain.states import JobState
from gpupool.metrics.definitions import NOTIFICATIONS

log = logging.getLogger("gpupool.notify")

#: ``session.info`` key of the notices a transaction made.
NOTICES = "gpupool.notices"
ATTEMPTS = 6
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
MAX_QUEUED = 10_000
SEND_TIMEOUT_S = 10.0


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


class Notifier:
    """The queue and worker thread of one server process (see the module docstring)."""

    def __init__(self, settings: ServerSettings, *, send: Sender | None = None) -> None:
        self.settings = settings
        self._send = send or self._deliver
        self._heap: list[tuple[float, int, int, Notice]] = []  # (due, seq, attempt, notice)
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def post(self, notices: Sequence[Notice]) -> None:
        """Queue ``notices`` for sending; never blocks on the network."""
        now = time.monotonic()
        webhook = self.settings.mail_webhook
        with self._cond:
            for notice in notices:
                if not notice.to:
                    if webhook is None:  # refused at submit; the setting went since
                        log.warning("notification of job %s: nowhere to send", notice.job_id)
                        continue
                    notice = replace(notice, to=webhook)  # noqa: PLW2901
                if len(self._heap) >= MAX_QUEUED or self._closed:
                    log.warning("notification of job %s dropped: queue full", notice.job_id)
                    NOTIFICATIONS.labels(notice.channel, "failed").inc()
                    continue
                heapq.heappush(self._heap, (now, next(self._seq), 1, notice))
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after what is due now is sent (``timeout`` at most)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self._heap:
            log.warning("%d notifications not sent: the server stopped", len(self._heap))

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                        return
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _, _, attempt, notice = heapq.heappop(self._heap)
                        break
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
            self._attempt(notice, attempt)

    def _attempt(self, notice: Notice, attempt: int) -> None:
        try:
            self._send(notice)
        except Exception as exc:  # any failure of the network or the receiver: retry
            if attempt >= ATTEMPTS:
                log.warning(
                    "notification %s of job %s to %s failed %d times, dropped: %s",
                    notice.event, notice.job_id, notice.to, attempt, exc,
                )  # fmt: skip
                NOTIFICATIONS.labels(notice.channel, "failed").inc()
                return
            backoff = min(FIRST_BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S)
            log.info("notification of job %s to %s: %s; retry in %gs", notice.job_id,
                     notice.to, exc, backoff)  # fmt: skip
            NOTIFICATIONS.labels(notice.channel, "retried").inc()
            with self._cond:
                due = time.monotonic() + backoff
                heapq.heappush(self._heap, (due, next(self._seq), attempt + 1, notice))
                self._cond.notify()
            return
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
