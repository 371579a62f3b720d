"""End to end: the server stops and starts again while jobs run (issue 17 item 2).

A server that was down, or that could not reach its store, has not seen heartbeats for that
time; it must not judge nodes by that silence. Agents keep their jobs running while the server
is away and retry often enough to be back within the node timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.pool import PY, Pool, wait_for
from tests.ports import free_port

NODE_TIMEOUT_S = 3.0


def _restart_server(pool: Pool) -> float:
    """Start ``gpupool server`` again on the pool's home and port; returns when it started."""
    log = open(pool.root / "server.log", "ab")  # noqa: SIM115 - the child owns it
    started = time.time()
    pool.server = subprocess.Popen(
        [
            PY,
            "-m",
            "tests.e2e.serve",
            "server",
            "--home",
            str(pool.home),
            "--port",
            str(pool.port),
            "--heartbeat",
            str(pool.heartbeat_s),
            "--node-timeout",
            str(pool.node_timeout_s),
        ],
        env=pool._env(),
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    return started


def _stop_server(pool: Pool) -> None:
    assert pool.server is not None
    pool.server.send_signal(signal.SIGTERM)
    pool.server.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _answers(pool: Pool) -> bool:
    try:
        assert pool.http is not None
        return pool.http.get("/readyz", timeout=2).status_code == 200
    except Exception:
        return False


@pytest.fixture
def short_timeout_pool(tmp_path: Path) -> Iterator[Pool]:
    p = Pool(tmp_path, node_timeout_s=NODE_TIMEOUT_S)
    try:
        p.start_server()
        p.start_agent("n1")
        p.start_agent("n2")
        yield p
    finally:
        p.close()


def test_server_stopped_twice_the_node_timeout_and_restarted_keeps_every_job_running(
    short_timeout_pool: Pool,
) -> None:
    pool = short_timeout_pool
    jobs = [pool.submit(f"keep{i}", "forever", resources={"gpus": "0.5"}) for i in range(4)]
    for job_id in jobs:
        pool.wait_state(job_id, "RUNNING")
    _stop_server(pool)
    # The scenario itself: the server stays away for twice the node timeout.
    time.sleep(2 * NODE_TIMEOUT_S)
    started = _restart_server(pool)
    wait_for(lambda: _answers(pool), 60, "the restarted server to be ready")

    # Every node heartbeats the new server, and the server has judged heartbeats for longer
    # than one node timeout since it started (each heartbeat after that moment proves it).
    def judged_past_grace() -> bool:
        nodes = pool.get("/v1/nodes")
        beats = [n["last_heartbeat"] for n in nodes]
        return bool(beats) and min(beats) > started + 2 * NODE_TIMEOUT_S

    wait_for(judged_past_grace, 90, "heartbeats past the restarted server's grace period")
    for node in pool.get("/v1/nodes"):
        assert node["state"] == "up", node
    for job_id in jobs:
        job = pool.job(job_id)
        assert job["state"] == "RUNNING", job
        assert job["restart_count"] == 0, job
        targets = [e["target"] for e in pool.get(f"/v1/jobs/{job_id}/events")]
        assert "NODE_FAIL" not in targets, targets
    downs = [e for e in pool.get("/v1/events") if e.get("kind") == "node.down"]
    assert downs == [], downs


#: The node timeout ``gpupool up`` is started with here (seconds; its default is 30). A freshly
#: started agent retries every 5 s at most until it has registered, so the margin over that
#: is kept wide for a loaded machine.
UP_NODE_TIMEOUT_S = 15.0


def _up(root: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPOOL_HOME": str(root / "home"), "PYTHONUNBUFFERED": "1"}
    log = open(root / "up.log", "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [
            PY,
            "-m",
            "gpupool.cli",
            "up",
            "--port",
            str(port),
            "--simulate",
            "2xT4",
            "--heartbeat",
            "1",
            "--node-timeout",
            str(UP_NODE_TIMEOUT_S),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_gpupool_up_stopped_twice_the_node_timeout_and_started_again_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _up(tmp_path, port)
    jobs: list[str] = []
    try:
        wait_for(lambda: _ready(url), 90, "gpupool up to answer")
        token = (tmp_path / "home" / "admin-token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20)
        wait_for(lambda: http.get("/v1/nodes").json(), 60, "the local agent to register")
        for i in range(2):
            body = {
                "spec": {
                    "name": f"long{i}",
                    "command": [PY, "-c", "import time; time.sleep(3600)"],
                    "resources": {"gpus": "0.5", "cpus": "0.1"},
                }
            }
            jobs.append(http.post("/v1/jobs", json=body).json()["job"]["id"])
        for job_id in jobs:
            wait_for(
                lambda j=job_id: http.get(f"/v1/jobs/{j}").json()["state"] == "RUNNING",
                60,
                f"job {job_id} running",
            )
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        # The scenario itself: the pool stays stopped for twice the node timeout.
        time.sleep(2 * UP_NODE_TIMEOUT_S)
        started = time.time()
        proc = _up(tmp_path, port)
        wait_for(lambda: _ready(url), 90, "gpupool up to answer again")

        def past_grace() -> bool:
            nodes = http.get("/v1/nodes").json()
            return bool(nodes) and min(n["last_heartbeat"] for n in nodes) > started + (
                2 * UP_NODE_TIMEOUT_S
            )

        wait_for(past_grace, 180, "heartbeats past the restarted pool's grace period")
        for job_id in jobs:
            job = http.get(f"/v1/jobs/{job_id}").json()
            assert (job["state"], job["restart_count"]) == ("RUNNING", 0), job
            targets = [e["target"] for e in http.get(f"/v1/jobs/{job_id}/events").json()]
            assert "NODE_FAIL" not in targets, targets
        for job_id in jobs:
            http.post(f"/v1/jobs/{job_id}/cancel", json={})
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for state in (tmp_path / "home" / "agent").glob("*/jobs/*/state.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(state.read_text())
                for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                    if data.get(key):
                        with contextlib.suppress(OSError):
                            kill(int(data[key]), signal.SIGKILL)
