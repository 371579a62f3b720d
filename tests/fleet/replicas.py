"""Two real ``gpupool server`` replicas on one PostgreSQL database and one real ``gpupool
agent`` talking to the servers it is given: the harness of tests/fleet/test_replicas.py (and
benchmarks/bench_replica_start.py) and of tests/e2e/test_leader_lease.py (a frozen leader).

Server ``a`` is started first and leads; ``b`` is the standby. Jobs hold until their go-file
exists, so a test ends them without killing anything; :meth:`Replicas.close` resumes frozen
servers and kills whatever replicas the agent left behind.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from gpupool.store.models import AssignmentModel
from tests.api.server_proc import ServerProcess
from tests.e2e.pool import kill_left_jobs, wait_for

#: A job that runs until its go-file exists.
HOLD = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.2)\n"


def leads(server: ServerProcess) -> str | None:
    """``yes``/``no`` from the server's ``/readyz``; ``None`` when it does not answer."""
    try:
        r = httpx.get(server.url + "/readyz", timeout=2)
    except httpx.HTTPError:
        return None
    return str(r.json().get("leader")) if r.status_code == 200 else None


class Replicas:
    """Servers ``a`` and ``b`` on database ``url``, started with ``server_args``; an agent
    (node ``n1``, two simulated A100s) once :meth:`start_agent` names its servers."""

    def __init__(self, root: Path, url: str, server_args: tuple[str, ...]) -> None:
        self.root = root
        self.url = url
        self.a = ServerProcess(root / "a" / "home", database_url=url, extra_args=server_args)
        self.b = ServerProcess(root / "b" / "home", database_url=url, extra_args=server_args)
        self.agent: subprocess.Popen[bytes] | None = None
        self.state_dir = root / "agent"
        self.http = httpx.Client(timeout=20)
        self.names: list[str] = []
        self.jobs: dict[str, str] = {}  # name -> job id
        self.token_file = root / "agent-token"

    def start_servers(self) -> None:
        self.a.start()
        wait_for(lambda: leads(self.a) == "yes", 90, "server a to lead")
        self.b.start()
        self.http.headers["Authorization"] = f"Bearer {self.a.admin_token()}"
        self.post(self.a, "/v1/users", {"name": "fleet-agent", "role": "agent"})
        secret = self.post(self.a, "/v1/tokens", {"user": "fleet-agent", "name": "t"})["secret"]
        self.token_file.write_text(secret)
        self.token_file.chmod(0o600)

    def start_agent(self, *servers: ServerProcess) -> None:
        flags = [arg for server in servers for arg in ("--server", server.url)]
        log = open(self.root / "agent.log", "ab")  # noqa: SIM115 - the child owns it
        self.agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "gpupool.cli", "agent", *flags),
                *("--token-file", str(self.token_file), "--simulate", "2xA100-80GB"),
                *("--node", "n1", "--state-dir", str(self.state_dir), "--address", "127.0.0.1"),
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_for(self._agent_up, 90, "agent n1 up")

    def _agent_up(self) -> bool:
        if self.agent is not None and self.agent.poll() is not None:
            log = (self.root / "agent.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"the agent exited ({self.agent.returncode}): {log}")
        return self.node_state(self.a) == "up"

    def node_state(self, server: ServerProcess) -> str | None:
        try:
            r = self.http.get(server.url + "/v1/nodes/n1")
        except httpx.HTTPError:
            return None
        return str(r.json()["state"]) if r.status_code == 200 else None

    def post(self, server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
        r = self.http.post(server.url + path, json=body)
        assert r.status_code < 300, f"{path}: {r.status_code} {r.text}"
        return r.json()

    def submit(self, server: ServerProcess, name: str) -> str:
        self.names.append(name)
        go = str(self.root / f"{name}.go")
        spec = {
            "name": name,
            "command": [sys.executable, "-c", HOLD, go],
            "resources": {"gpus": "1"},
        }
        job = str(self.post(server, "/v1/jobs", {"spec": spec})["job"]["id"])
        self.jobs[name] = job
        return job

    def state(self, server: ServerProcess, job_id: str) -> str | None:
        try:
            r = self.http.get(f"{server.url}/v1/jobs/{job_id}")
        except httpx.HTTPError:
            return None
        return str(r.json()["state"]) if r.status_code == 200 else None

    def time_to_running(self, server: ServerProcess, name: str, timeout_s: float) -> float:
        """Submit ``name`` through ``server``; seconds until it is RUNNING (as seen there)."""
        t0 = time.monotonic()
        job = self.submit(server, name)
        wait_for(lambda: self._running(server, job), timeout_s, f"{name} to run")
        return time.monotonic() - t0

    def finish(self, server: ServerProcess, name: str) -> None:
        """Let the job ``name`` (submitted by :meth:`submit`) end, and wait until it has."""
        job = self.jobs[name]
        (self.root / f"{name}.go").touch()
        wait_for(lambda: self.state(server, job) == "COMPLETED", 120, f"{name} to complete")

    def _running(self, server: ServerProcess, job: str) -> bool:
        state = self.state(server, job)
        if state in ("FAILED", "NODE_FAIL", "CANCELLED", "COMPLETED"):
            raise AssertionError(f"job {job} ended {state} instead of running")
        return state == "RUNNING"

    def assignments(self) -> list[tuple[str, str | None]]:
        """(job id, stop reason) of every assignment in the store."""
        engine = create_engine(self.url)
        try:
            with Session(engine) as s:
                rows = s.execute(select(AssignmentModel.job_id, AssignmentModel.stop_reason))
                return [(str(j), r) for j, r in rows.all()]
        finally:
            engine.dispose()

    def close(self) -> None:
        for server in (self.a, self.b):
            if server.proc is not None and server.proc.poll() is None:
                with contextlib.suppress(OSError):
                    server.proc.send_signal(signal.SIGCONT)
        for name in self.names:
            (self.root / f"{name}.go").touch()
        if self.agent is not None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.agent.kill()
        kill_left_jobs(self.state_dir)
        self.a.stop()
        self.b.stop()
        self.http.close()


@contextlib.contextmanager
def running(
    root: Path, url: str, server_args: tuple[str, ...], *, agent_on: str = "b"
) -> Iterator[Replicas]:
    """Two servers on ``url`` started with ``server_args`` and one agent given the servers
    ``agent_on`` names (``"b"``: the standby alone; ``"ab"``: both), all stopped at the end."""
    pair = Replicas(root, url, server_args)
    try:
        pair.start_servers()
        pair.start_agent(*(getattr(pair, which) for which in agent_on))
        yield pair
    finally:
        pair.close()
