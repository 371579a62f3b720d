"""``gpupool alloc`` (salloc) against a real server and two real agents.

The allocation's command runs on this machine with the slice's devices in
``CUDA_VISIBLE_DEVICES``, the slice is on the node named by ``--node`` (this machine's), the
command's exit status is alloc's, the holder job is cancelled when the command ends, and Ctrl-C
while the request waits cancels it.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.clirun import cli_env
from tests.e2e.pool import PY, Pool, wait_for


@pytest.fixture(scope="module")
def apool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    with Pool.running(
        tmp_path_factory.mktemp("alloc"), {"n1": "4xA100-80GB", "n2": "4xA100-80GB"}
    ) as p:
        yield p


def test_alloc_runs_the_command_here_with_the_slice_and_releases_it(
    apool: Pool, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    script = f"echo $CUDA_VISIBLE_DEVICES $GPUPOOL_ALLOCATION $GPUPOOL_JOB_ID > {seen}; exit 4"
    ran = subprocess.run(
        [PY, "-m", "gpupool.cli", "alloc", "-g", "2", "--node", "n2", "--", "sh", "-c", script],
        env=cli_env(apool),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 4, ran.stderr
    devices, job_id, job_id_again = seen.read_text().split()
    assert job_id == job_id_again
    assert f"granted job allocation {job_id} on node n2" in ran.stderr
    on = apool.device_nodes()
    assert [on[d] for d in devices.split(",")] == ["n2", "n2"]
    apool.wait_state(job_id, "CANCELLED")  # released when the command ended
    assert f"relinquishing job allocation {job_id}" in ran.stderr


def test_ctrl_c_while_waiting_cancels_the_request(apool: Pool) -> None:
    blocker = apool.submit("fill-n1", "forever", resources={"gpus": 4}, nodelist=["n1"])
    apool.wait_state(blocker, "RUNNING")
    proc = subprocess.Popen(
        [PY, "-m", "gpupool.cli", "alloc", "-g", "4", "--node", "n1", "--", "true"],
        env=cli_env(apool),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def waiting() -> str | None:
            jobs = apool.get("/v1/jobs?state=PENDING")["jobs"]
            return next((j["id"] for j in jobs if j["name"].startswith("interactive-")), None)

        held = wait_for(waiting, 120, "the allocation's request to pend")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        apool.post(f"/v1/jobs/{blocker}/cancel", {})
    assert proc.returncode == 130, err
    assert "request cancelled" in err
    apool.wait_state(held, "CANCELLED")
