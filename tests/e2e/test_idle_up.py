"""An idle ``gpupool up`` sleeps (issue 26), yet still stops at once and still honours a
revocation at once.

What the cuts changed and this guards, along the user's path (a real ``gpupool up``): its
HTTP server's loop no longer ticks (a stop wakes it), its local agent sleeps until its next
quiet beat (a third of the node timeout: 100 s here; a stop wakes it), and it keeps tokens'
principals in memory for minutes (its store is its own, so a revocation through it clears
them at once). No timing assertion: the waits are bounds, generous for a loaded machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.pool import free_port
from tests.readiness import answers_ready, wait_ready


def test_an_idle_up_honours_a_revocation_at_once_and_stops_at_once_on_sigterm(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    env = {**os.environ, "GPUPOOL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "up.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "gpupool.cli", "up", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--simulate", "2xT4", "--node-timeout", "300"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_ready(lambda: answers_ready(url), what="gpupool up", proc=proc, log=log_path)
        admin = {"Authorization": f"Bearer {(home / 'admin-token').read_text().strip()}"}
        with httpx.Client(base_url=url, headers=admin, timeout=30) as http:
            wait_ready(lambda: http.get("/v1/nodes").json(), what="the local agent", proc=proc)
            assert http.post("/v1/users", json={"name": "alice", "role": "operator"}).is_success
            issued = http.post("/v1/tokens", json={"user": "alice", "name": "laptop"}).json()
            alice = {"Authorization": f"Bearer {issued['secret']}"}
            assert httpx.get(f"{url}/v1/whoami", headers=alice).status_code == 200  # cached
            assert http.delete(f"/v1/tokens/{issued['id']}").status_code == 204
            refused = httpx.get(f"{url}/v1/whoami", headers=alice)
            assert refused.status_code == 401, refused.text
            assert "revoked" in refused.json()["detail"]
        time.sleep(3.0)  # past the first beats: everything sleeps
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)  # the agent's next beat is 100 s away
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    output = log_path.read_text()
    assert code == 0, output
    assert "gpupool stopped (SIGTERM)" in output
    assert "Traceback" not in output
