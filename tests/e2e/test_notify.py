"""``--mail-type`` / ``--mail-user`` on the user's path: a real server and agent, jobs submitted
through the ``gpupool`` CLI, the notices received by a local SMTP server and a local webhook
receiver (:mod:`tests.e2e.sinks`) with the job's id, name, state and exit code.

- an e-mail address: BEGIN and END of a job that completes, through the server's SMTP host;
- a webhook URL: BEGIN and FAIL (exit code 3) of a job that fails, the first POST refused (503)
  and retried, counted in ``gpupool_notifications_total`` (a retried notice may arrive after a
  later one: each carries its event, state and time);
- refused at submit: an unknown mail type, an address on a server with no SMTP host (naming
  ``--smtp-host``), mail types with nowhere to go (naming ``--mail-user`` and
  ``--mail-webhook``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.pool import PY, Pool, wait_for
from tests.e2e.sinks import HookSink, SmtpSink
from tests.e2e.test_workflow import cli


class MailPool(Pool):
    """A pool whose server sends notices through ``smtp_port`` (none: no SMTP host)."""

    smtp_port: int | None = None

    def _env(self) -> dict[str, str]:
        env = super()._env()
        if self.smtp_port is not None:
            env.update(
                GPUPOOL_SMTP_HOST="127.0.0.1",
                GPUPOOL_SMTP_PORT=str(self.smtp_port),
                GPUPOOL_SMTP_FROM="pool@example.org",
            )
        return env


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


@pytest.fixture(scope="module")
def mpool(tmp_path_factory: pytest.TempPathFactory, smtp: SmtpSink) -> Iterator[Pool]:
    class Mailed(MailPool):
        smtp_port = smtp.port

    with Mailed.running(tmp_path_factory.mktemp("notify"), {"n1": "4xA100-80GB"}) as pool:
        yield pool


def submit(pool: Pool, *args: str) -> str:
    done = cli(pool, "submit", "-g", "0.1", "--parsable", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_address_gets_begin_and_end_by_email(mpool: Pool, smtp: SmtpSink) -> None:
    job = submit(
        mpool, "-J", "mailed", "--mail-type", "ALL", "--mail-user", "ann@example.org",
        "--", PY, "-c", "print('hi')",
    )  # fmt: skip
    mpool.wait_state(job, "COMPLETED", timeout=120)

    def mine() -> list[dict[str, str]] | None:
        found = [
            dict(m.items()) | {"body": str(m.get_payload())}
            for m in smtp.messages
            if f"Job_id={job} " in m["Subject"]
        ]
        return found if len(found) == 2 else None

    begin, end = wait_for(mine, timeout=60, what="two e-mails")
    assert begin["Subject"] == f"gpupool Job_id={job} Name=mailed Began, RUNNING"
    assert end["Subject"] == f"gpupool Job_id={job} Name=mailed Ended, COMPLETED, ExitCode 0"
    assert (end["To"], end["From"]) == ("ann@example.org", "pool@example.org")
    for line in (f"job_id: {job}", "name: mailed", "state: COMPLETED", "exit_code: 0"):
        assert line in end["body"]
    assert ["ann@example.org"] in smtp.recipients


def test_a_webhook_gets_begin_and_fail_with_the_exit_code_after_a_retry(mpool: Pool) -> None:
    with HookSink(fail_first=1) as hook:
        job = submit(
            mpool, "-J", "hooked", "--mail-type", "BEGIN,FAIL", "--mail-user", hook.url,
            "--", PY, "-c", "import sys; sys.exit(3)",
        )  # fmt: skip
        mpool.wait_state(job, "FAILED", timeout=120)
        wait_for(lambda: len(hook.bodies) == 2, timeout=60, what="two webhook calls")
        # the first POST (BEGIN) was refused and sent again, after the FAIL went through
        assert hook.refused == 1
        told = {body["event"]: body for body in hook.bodies}
    begin, fail = told["BEGIN"], told["FAIL"]
    assert (begin["job_id"], begin["name"], begin["event"], begin["state"]) == (
        job, "hooked", "BEGIN", "RUNNING",
    )  # fmt: skip
    assert (fail["job_id"], fail["event"], fail["state"], fail["exit_code"]) == (
        job, "FAIL", "FAILED", 3,
    )  # fmt: skip
    metrics = httpx.get(f"{mpool.url}/metrics", timeout=20).text
    assert 'gpupool_notifications_total{channel="webhook",outcome="retried"} 1.0' in metrics
    assert 'gpupool_notifications_total{channel="webhook",outcome="sent"} 2.0' in metrics


def test_an_unknown_mail_type_is_refused_at_submit(mpool: Pool) -> None:
    done = cli(
        mpool, "submit", "--mail-type", "BEGAN", "--mail-user", "a@example.org", "--", "true"
    )
    assert done.returncode != 0
    assert "'BEGAN' is not a mail type: use BEGIN, END, FAIL, REQUEUE, ALL or NONE" in done.stderr


def test_a_server_without_smtp_refuses_an_address_naming_the_setting(tmp_path: Path) -> None:
    bare = MailPool(tmp_path)  # no SMTP host, no webhook
    try:
        bare.start_server()
        mailed = cli(bare, "submit", "--mail-type", "END", "--mail-user", "a@example.org",
                     "--", "true")  # fmt: skip
        assert mailed.returncode != 0
        text = " ".join(mailed.stderr.split())
        assert "--mail-user a@example.org is an e-mail address, and this server has no SMTP" in text
        assert "gpupool server --smtp-host HOST" in text
        nowhere = cli(bare, "submit", "--mail-type", "END", "--", "true")
        assert nowhere.returncode != 0
        assert "--mail-type needs --mail-user" in " ".join(nowhere.stderr.split())
        assert "--mail-webhook" in nowhere.stderr
        queue = cli(bare, "queue", "--json")
        assert queue.returncode == 0
        assert queue.stdout.strip() in ("[]", "")  # nothing was stored
    finally:
        bare.close()
