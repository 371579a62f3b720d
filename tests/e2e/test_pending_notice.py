"""While ``gpupool run`` and ``gpupool.allocate()`` wait for a job to start, they say why it
waits on stderr, each time the reason changes, so a CI step or a notebook cell is not silent."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

import gpupool
from gpupool.client import Client
from tests.e2e.pool import PY, REPO, Pool, wait_for


def _lines(stream: Any) -> queue.Queue[str]:
    """The lines of a child's pipe, as they come."""
    got: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            got.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return got


def test_run_of_a_held_job_says_why_it_waits_then_streams_once_released(
    pool: Pool, tmp_path: Path
) -> None:
    token = (pool.home / "admin-token").read_text().strip()
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    run = [PY, "-m", "gpupool.cli", "run", "--server", pool.url, "--token", token]
    proc = subprocess.Popen(
        [*run, "-H", "-J", "waiter", "-g", "0.25", "--", "sh", "-c", "echo started"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        errors = _lines(proc.stderr)
        seen: list[str] = []

        def said_pending() -> str | None:
            while not errors.empty():
                seen.append(errors.get())
            return next((x for x in seen if x.startswith("gpupool: job ")), None)

        notice = wait_for(said_pending, 90, "run to say why the job waits")
        job_id = seen[0].split()[2]
        assert notice.startswith(f"gpupool: job {job_id} is pending: ")
        assert "held" in notice.lower()
        pool.post(f"/v1/jobs/{job_id}/release", {})
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out == "started\n"


def test_allocate_says_why_it_waits_while_the_pool_is_full(
    pool: Pool, capsys: pytest.CaptureFixture[str]
) -> None:
    whole_node = {"resources": {"gpus": "4"}}
    blockers = [pool.submit(f"full-{i}", "forever", **whole_node) for i in range(2)]
    for job_id in blockers:
        pool.wait_state(job_id, "RUNNING")
    token = (pool.home / "admin-token").read_text().strip()
    got: dict[str, Any] = {}

    def allocate() -> None:
        with Client(pool.url, token) as gp:
            try:
                # n1 and n2 both run on this machine: name the node this allocation is for
                with gpupool.allocate(
                    gpus=0.5, client=gp, hold="10m", timeout_s=300, node="n1"
                ) as a:
                    got["job"] = a.job_id
            except Exception as exc:
                got["error"] = exc

    worker = threading.Thread(target=allocate, daemon=True)
    worker.start()
    said: list[str] = []

    def pending_said() -> bool:
        said.append(capsys.readouterr().err)
        return "is pending: " in "".join(said)

    try:
        wait_for(pending_said, 90, "allocate() to say why it waits")
    finally:
        for job_id in blockers:
            pool.post(f"/v1/jobs/{job_id}/cancel", {})
    worker.join(timeout=120)
    assert "error" not in got, got
    assert "job" in got
    notice = next(x for x in "".join(said).splitlines() if "is pending" in x)
    assert notice.startswith(f"gpupool: job {got['job']} is pending: ")
