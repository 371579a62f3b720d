"""Issue 27 on the user's path: a real server, a real agent and the ``gpupool`` CLI.

- a job its team's quota can never admit is refused at submit with the limit and what to
  change, and queued with ``--queue-anyway`` it says so as its pending reason;
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.pool import PY, REPO, Pool, wait_for


@pytest.fixture(scope="module")
def wpool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A server and one agent, n1, with 4 simulated A100s."""
    p = Pool(tmp_path_factory.mktemp("workflow"))
    try:
        p.start_server()
        p.start_agent("n1")
        yield p
    finally:
        p.close()


def cli(pool: Pool, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``gpupool ARGS`` as the pool's admin, from a folder of the test's own."""
    token = (pool.home / "admin-token").read_text().strip()
    env = {
        **os.environ,
        "GPUPOOL_HOME": str(pool.root / "cli-home"),
        "GPUPOOL_SERVER": pool.url,
        "GPUPOOL_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p),
    }
    return subprocess.run(
        [PY, "-m", "gpupool.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=pool.root,
        check=False,
    )


def test_a_job_its_quota_never_admits_is_refused_at_submit_with_what_to_change(
    wpool: Pool,
) -> None:
    assert cli(wpool, "tenants", "set", "course").returncode == 0
    done = cli(wpool, "quota", "set", "course", "default", "--guaranteed", "0.5")
    assert done.returncode == 0, done.stderr
    refused = cli(wpool, "submit", "-A", "course", "-g", "1", "--", "true")
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert "more than tenant course's guaranteed 0.5 GPUs in pool default" in said
    assert "mark the job preemptible (--preemptible)" in said
    assert "gpupool quota set course default" in said
    assert wpool.get("/v1/jobs?tenant=course")["jobs"] == []
    # Queued anyway, it waits with the same sentence, not "wait for other jobs".
    queued = cli(
        wpool, "submit", "-A", "course", "-g", "1", "--queue-anyway", "--parsable", "--", "true"
    )
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()

    def reason() -> str | None:
        found = wpool.job(job_id).get("pending_reason")
        return str(found) if found else None

    wait_for(reason, 60, "a pending reason")
    shown = cli(wpool, "show", job_id)
    assert "can never start" in " ".join(shown.stdout.split())
    # Preemptible, the same job borrows the idle pool and runs.
    ok = cli(
        wpool, "submit", "-A", "course", "-g", "1", "--preemptible", "--parsable", "--", "true"
    )
    assert ok.returncode == 0, ok.stderr
    wpool.wait_state(ok.stdout.strip(), "COMPLETED", timeout=120)
    cli(wpool, "cancel", job_id)
