"""Nothing a job's files hold may delay its node's heartbeat (issue 24 item 4).

The agent unpacked uploads and packed results on its heartbeat path: a 20,000-empty-file upload
stalled it, and a ``truncate -s 3G`` file in a job's folder kept it gzipping zeros for minutes
while the server marked the node down and the agent's own fence stopped the other tenants'
jobs. Now the replica's supervisor does that work, as the job's account, on a wall-time and an
input-byte budget (agent/jobsteps.py). Each test runs a bystander job on the node, then the
job with the heavy files, and watches the node (every 0.2 s) from start to end: it must never
be marked down, the bystander must keep running untouched, and the heavy job must end with
its results or a clear reason. The node timeout is short (6 s): the sparse file's gzip on the
old heartbeat path took longer than that here.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.client.pack import pack_folder
from tests.e2e.pool import PY, Pool, wait_for

SPARSE = "open('big.bin', 'wb').truncate(3 << 30)"
LISTER = "import os; print(len(os.listdir('.')), flush=True)"


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    with Pool.running(tmp_path, {"n1": "2xA100-80GB"}, node_timeout_s=6.0) as p:
        yield p


class NodeWatch:
    """Every state node ``n1`` is seen in, sampled every 0.2 s until :meth:`stop`."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.states: set[str] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.2):
            node = self.pool.node("n1")
            if node is not None:
                self.states.add(str(node["state"]))

    def stop(self) -> set[str]:
        self._done.set()
        self._thread.join(10)
        return self.states


def _upload(pool: Pool, fill: Any) -> str:
    with tempfile.TemporaryDirectory() as folder:
        fill(Path(folder))
        data = pack_folder(Path(folder))
    assert pool.http is not None
    r = pool.http.post("/v1/uploads", content=data, headers={"Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    return str(r.json()["upload_id"])


def _run_beside_a_bystander(pool: Pool, upload: str, program: str) -> tuple[dict[str, Any], str]:
    """Run ``program`` in a copy of ``upload`` beside a running bystander; returns the job and
    its results answer (the archive's size, or the problem)."""
    bystander = pool.submit("bystander", "forever", resources={"gpus": 1})
    pool.wait_state(bystander, "RUNNING")
    watch = NodeWatch(pool)
    body = {"spec": {"name": "heavy", "command": [PY, "-c", program], "resources": {"gpus": 1}}}
    job_id = str(pool.post("/v1/jobs", {**body, "workdir_upload": upload})["job"]["id"])
    job = pool.wait_state(job_id, "COMPLETED", "FAILED", "BOOT_FAIL", timeout=400)
    assert pool.http is not None
    got = wait_for(
        lambda: (
            (r := pool.http.get(f"/v1/jobs/{job_id}/results")).status_code  # type: ignore[union-attr]
            in (200, 409)
            and r
        ),
        120,
        "the heavy job's results",
    )
    states = watch.stop()
    assert states == {"up"}, f"node n1 was {states} while the heavy job ran"
    after = pool.job(bystander)
    assert (after["state"], after["restart_count"]) == ("RUNNING", 0), after
    said = str(len(got.content)) if got.status_code == 200 else got.json()["detail"]
    return job, said


def test_a_sparse_3g_file_in_a_jobs_folder_takes_no_node_down(pool: Pool) -> None:
    upload = _upload(pool, lambda folder: (folder / "train.py").write_text("pass\n"))
    job, said = _run_beside_a_bystander(pool, upload, SPARSE)
    assert job["state"] == "COMPLETED", job
    assert "over the budget for results" in said, said
    assert "sparse files too" in said


def test_an_upload_of_20000_empty_files_takes_no_node_down(pool: Pool) -> None:
    def fill(folder: Path) -> None:
        for i in range(20_000):
            (folder / f"f{i:05d}").touch()

    upload = _upload(pool, fill)
    job, said = _run_beside_a_bystander(pool, upload, LISTER)
    assert job["state"] == "COMPLETED", job
    assert int(said) > 0  # the results came back: the 20,000 files, packed by the supervisor
