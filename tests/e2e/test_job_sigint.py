"""A job's SIGINT is its own: the supervisor does not hand its program SIGINT ignored.

The supervisor ignores a Ctrl-C meant for the agent's terminal; it used to do that with
``SIG_IGN``, which survives ``exec``, so every job started with SIGINT ignored: Python never
installed its KeyboardInterrupt handler, ``--checkpoint-signal SIGINT`` never reached the
program, and ``run --pty``'s Ctrl-C could not interrupt a command in the job's shell.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.clirun import gpupool
from tests.e2e.pool import PY, Pool, wait_for

PROGRAM = r"""
import signal, sys, time
print("sigint:", "default" if signal.getsignal(signal.SIGINT) is signal.default_int_handler
      else signal.getsignal(signal.SIGINT), flush=True)
try:
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted: checkpointing", flush=True)
    sys.exit(0)
"""


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    with Pool.running(tmp_path_factory.mktemp("sigint"), {"n1": "1xA100-80GB"}) as p:
        yield p


def test_sigint_as_the_checkpoint_signal_reaches_a_python_job(spool: Pool) -> None:
    done = gpupool(
        spool, "submit", "--parsable", "-g", "0.5", "--checkpoint-signal", "SIGINT",
        "--grace", "60", "--", PY, "-c", PROGRAM,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: "sigint:" in gpupool(spool, "logs", job_id).stdout, 60, "the job's start")
    assert "sigint: default" in gpupool(spool, "logs", job_id).stdout
    spool.post(f"/v1/jobs/{job_id}/cancel", {})
    ended = spool.wait_state(job_id, "CANCELLED", timeout=90)
    assert "interrupted: checkpointing" in gpupool(spool, "logs", job_id).stdout
    assert "killed after its grace period" not in (ended["reason"] or "")
