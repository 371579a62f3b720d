"""A live pool for the dashboard tests: a ``gpupool server`` process and one ``gpupool agent``
with simulated GPUs, on a free port in a temporary folder, plus two teams with users.

People in the pool (each with a token in :attr:`LivePool.tokens`):

- ``admin``: the first-start admin token;
- ``alice``: member of ``team-a``; ``bob``: member of ``team-b``;
- ``carol``: viewer in ``team-a`` (may read, not cancel).

Jobs started here are short ``sleep`` commands; :meth:`LivePool.close` cancels what is left
and kills any job process an agent left behind, so nothing outlives the test session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready

T = TypeVar("T")
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
NODE = "sim-1"
GPU_SPEC = "4xA100-80GB,2xT4"
GPU_COUNT = 6
PEOPLE = {
    "alice": ("member", "team-a"),
    "bob": ("member", "team-b"),
    "carol": ("viewer", "team-a"),
}


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


class LivePool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tokens: dict[str, str] = {}

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = {**os.environ, "GPUPOOL_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [PY, "-m", "gpupool.cli", *args],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self, *, agent: bool = True) -> None:
        server = self._spawn(
            "server", "server", "--home", str(self.home), "--port", str(self.port),
            "--heartbeat", "0.5",
        )  # fmt: skip
        wait_ready(
            lambda: answers_ready(self.url),
            what="the server to answer /readyz",
            proc=server,
            log=self.root / "server.log",
        )
        self.tokens["admin"] = (self.home / "admin-token").read_text().strip()
        for team in ("team-a", "team-b"):
            self.call("admin", "PUT", f"/v1/tenants/{team}", {"fair_share": 1.0})
        for name, (role, team) in PEOPLE.items():
            self.call("admin", "POST", "/v1/users", {"name": name, "role": role, "tenant": team})
            self.tokens[name] = self.call("admin", "POST", "/v1/tokens", {"user": name})["secret"]
        self.call("admin", "POST", "/v1/users", {"name": "web-agent", "role": "agent"})
        agent_token = self.agent_token = self.root / "agent-token"
        agent_token.write_text(
            self.call("admin", "POST", "/v1/tokens", {"user": "web-agent"})["secret"]
        )
        if not agent:
            return
        agent_proc = self._spawn(
            "agent", "agent", "--server", self.url, "--token-file", str(agent_token),
            "--simulate", GPU_SPEC, "--node", NODE, "--state-dir", str(self.root / "agent"),
            "--address", "127.0.0.1",
        )  # fmt: skip

        def agent_up() -> bool:
            devices = self.call("admin", "GET", "/v1/devices")
            return len(devices) == GPU_COUNT

        wait_ready(agent_up, what="the agent's GPUs", proc=agent_proc, log=self.root / "agent.log")

    def call(self, who: str, method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(
            method,
            f"{self.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.tokens[who]}"},
            timeout=20,
        )
        assert r.status_code < 300, f"{method} {path} as {who}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def submit(
        self,
        who: str,
        name: str,
        gpus: str = "0.5",
        seconds: int = 120,
        *,
        queue_anyway: bool = False,  # a job no node could hold: pending instead of refused
    ) -> str:
        spec = {"name": name, "command": ["sleep", str(seconds)], "resources": {"gpus": gpus}}
        body = {"spec": spec, "queue_anyway": queue_anyway}
        return str(self.call(who, "POST", "/v1/jobs", body)["job"]["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.call("admin", "GET", f"/v1/jobs/{job_id}"))

    def wait_state(self, job_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(
            lambda: j if (j := self.job(job_id))["state"] in states else None,
            timeout,
            f"job {job_id} to reach {states}",
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for j in self.call("admin", "GET", "/v1/jobs", None)["jobs"]:
                if j["state"] in ("PENDING", "CONFIGURING", "RUNNING"):
                    self.call("admin", "POST", f"/v1/jobs/{j['id']}/cancel", {})
            time.sleep(1.0)
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for state in (self.root / "agent").glob("jobs/*/state.json"):
            try:
                data = json.loads(state.read_text())
            except (OSError, ValueError):
                continue
            for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                if data.get(key):
                    with contextlib.suppress(OSError):
                        kill(int(data[key]), signal.SIGKILL)
