"""``gpupool up`` on a machine without a GPU: server, scheduler and a simulated local agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.pool import wait_for
from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready


def test_up_runs_a_job_from_the_api_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "up", "--port", str(port), "--simulate", "2xT4"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_ready(
            lambda: answers_ready(url), what="gpupool up", proc=proc, log=tmp_path / "up.log"
        )
        token = (tmp_path / "home" / "admin-token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
        wait_ready(
            lambda: http.get("/v1/nodes").json(),
            what="the local agent to register",
            proc=proc,
            log=tmp_path / "up.log",
        )
        body = {
            "spec": {
                "name": "hello",
                "command": ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
                "resources": {"gpus": "0.5"},
            }
        }
        job_id = http.post("/v1/jobs", json=body).json()["job"]["id"]
        done = wait_for(
            lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["state"] == "COMPLETED" and j,
            60,
            "the job to complete",
        )
        assert done["exit_code"] == 0
        devices = {d["uuid"] for d in http.get("/v1/devices").json()}
        assert len(devices) == 2
        logs = list((tmp_path / "home" / "agent").glob("*/*/*/stdout.log"))
        assert [p.read_text().strip() in devices for p in logs] == [True]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    output = (tmp_path / "up.log").read_text()
    assert code in (0, 130), output  # 130: the usual exit code after Ctrl-C
    assert "admin token" in output
    assert "local agent: node" in output
    assert "Traceback" not in output
