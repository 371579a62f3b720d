"""``gpupool cancel --array`` and ``queue --array`` past one page of the job listing.

The listing answers at most 1,000 jobs a page; the SDK follows ``next_cursor`` to the end.
Before, ``cancel --array`` of a 10,000-task array cancelled the first 1,000 and said nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.client.sdk import Client
from tests.api.server_proc import ServerProcess

TASKS = 1_050  # more than one page of 1,000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("pages") / "home")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _cli(server: ServerProcess, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_HOME": str(home)}
    cmd = [sys.executable, "-m", "gpupool.cli", *args]
    cmd += ["--server", server.url, "--token", server.admin_token()]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)


def test_gpupool_cancel_array_cancels_every_task_past_the_first_page(
    server: ServerProcess, tmp_path: Path
) -> None:
    spec = {"name": "sweep", "command": ["true"], "resources": {"gpus": "0.1"}}
    headers = {"Authorization": f"Bearer {server.admin_token()}"}
    r = httpx.post(
        f"{server.url}/v1/jobs",
        json={"spec": spec, "array": f"0-{TASKS - 1}", "hold": True},
        headers=headers,
        timeout=300,
    )
    assert r.status_code == 201, r.text[:300]
    array_id = r.json()["job"]["array_id"]

    listed = _cli(server, tmp_path, "queue", "--array", array_id, "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == TASKS

    done = _cli(server, tmp_path, "cancel", "--array", array_id)
    assert done.returncode == 0, done.stderr

    with Client(server.url, token=server.admin_token()) as gp:
        tasks = gp.list(array=array_id, limit=None)
    assert len(tasks) == TASKS
    assert {t.state for t in tasks} == {"CANCELLED"}
    assert done.stdout.count(": CANCELLED") == TASKS
