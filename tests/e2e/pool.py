"""A real pool for end-to-end tests: a ``gpupool server`` process and ``gpupool agent``
processes with simulated GPUs, on a free port in a temporary folder.

Jobs in these tests are small Python programs (see ``JOB``) that write what they saw (their
environment, restart count, whether a checkpoint existed, signals received) to a JSON file in
``out/``, named ``<job name>.<replica rank>.<restart count>.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready

T = TypeVar("T")
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]

#: The program every e2e job runs. argv: out folder, then "mode" words:
#:   wait     -- on the first run, wait for <out>/<name>.go (then exit with <out>/<name>.code)
#:   trap     -- on SIGTERM write a checkpoint file and exit 0
#:   rendezvous -- gang: rank 0 listens on MASTER_PORT, rank 1 connects and says hello
#:   sleep=S  -- sleep S seconds before exiting
JOB = r"""
import json, os, signal, socket, sys, time
out, modes = sys.argv[1], sys.argv[2:]
e = os.environ
name = e["GPUPOOL_JOB_NAME"]
rank = e.get("RANK", "0")
restart = int(e["GPUPOOL_RESTART_COUNT"])
ckpt = os.path.join(e["GPUPOOL_CHECKPOINT_DIR"], "state.txt")
record = {"env": {k: v for k, v in e.items() if k.startswith(("GPUPOOL_", "CUDA_", "MASTER_"))
                  or k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")},
          "found_checkpoint": os.path.exists(ckpt), "pid": os.getpid(), "start": time.time()}
path = os.path.join(out, f"{name}.{rank}.{restart}.json")
def save(**kw):
    record.update(kw)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
with open(os.path.join(out, f"{name}.starts"), "a") as f:
    f.write(f"{restart}\n")
def on_term(*_):
    with open(ckpt, "w") as f:
        f.write("checkpointed")
    save(got_sigterm=True)
    sys.exit(0)
if "trap" in modes:
    signal.signal(signal.SIGTERM, on_term)
save()
for m in modes:
    if m.startswith("sleep="):
        time.sleep(float(m.split("=")[1]))
if "wait" in modes and restart == 0:
    go = os.path.join(out, name + ".go")
    while not os.path.exists(go):
        time.sleep(0.05)
    code = os.path.join(out, name + ".code")
    sys.exit(int(open(code).read()) if os.path.exists(code) else 0)
if "forever" in modes and restart == 0:
    while True:
        time.sleep(1)
if "rendezvous" in modes:
    addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
    deadline = time.time() + 60
    if rank == "0":
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port)); srv.listen(1); srv.settimeout(60)
        conn, _ = srv.accept(); save(peer=conn.recv(100).decode()); conn.close()
    else:
        while True:
            try:
                c = socket.create_connection((addr, port), timeout=2); break
            except OSError:
                if time.time() > deadline: raise
                time.sleep(0.1)
        c.sendall(f"hello from rank {rank}".encode()); c.close(); save(peer="sent")
"""


def wait_for(probe: Callable[[], T | None], timeout: float = 60.0, what: str = "it") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def kill_left_jobs(folder: Path, pattern: str = "jobs/*/state.json") -> None:
    """Kill every supervisor and job whose agent state (``pattern`` under ``folder``) names."""
    for state in folder.glob(pattern):
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
            if data.get(key):
                with contextlib.suppress(OSError):
                    kill(int(data[key]), signal.SIGKILL)


class Pool:
    """One server and any number of agents (see the module docstring)."""

    #: More ``gpupool agent`` options for every agent (a subclass's, e.g. ``--run-as``).
    agent_args: tuple[str, ...] = ()

    def __init__(self, root: Path, *, heartbeat_s: float = 0.5, node_timeout_s: float = 30.0):
        self.root = root
        self.home = root / "home"
        self.out = root / "out"
        self.checkpoints = root / "checkpoints"
        for p in (self.home, self.out, self.checkpoints):
            p.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.heartbeat_s = heartbeat_s
        self.node_timeout_s = node_timeout_s
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.server: subprocess.Popen[bytes] | None = None
        self.http: httpx.Client | None = None
        self.agent_token = root / "agent-token"

    # -- processes
    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "GPUPOOL_HOME": str(self.home),
            "PYTHONUNBUFFERED": "1",
            # the caller's PYTHONPATH first: a test run against an older tree
            # (PYTHONPATH=/tmp/old/src) starts its server and agents from that tree too
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p
            ),
        }

    def start_server(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the child owns it
        self.server = subprocess.Popen(
            [
                PY,
                "-m",
                "tests.e2e.serve",
                "server",
                "--home",
                str(self.home),
                "--port",
                str(self.port),
                "--heartbeat",
                str(self.heartbeat_s),
                "--node-timeout",
                str(self.node_timeout_s),
            ],
            env=self._env(),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

        wait_ready(
            lambda: answers_ready(self.url),
            what="the server",
            proc=self.server,
            log=self.root / "server.log",
        )
        token = (self.home / "admin-token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.url, timeout=20, headers={"Authorization": f"Bearer {token}"}
        )
        self.post("/v1/users", {"name": "e2e-agent", "role": "agent"})
        secret = self.post("/v1/tokens", {"user": "e2e-agent", "name": "e2e"})["secret"]
        self.agent_token.write_text(secret)

    def start_agent(self, node: str, spec: str = "4xA100-80GB") -> subprocess.Popen[bytes]:
        log = open(self.root / f"agent-{node}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "gpupool.cli",
                "agent",
                "--server",
                self.url,
                "--token-file",
                str(self.agent_token),
                "--simulate",
                spec,
                "--node",
                node,
                "--state-dir",
                str(self.state_dir(node)),
                "--address",
                "127.0.0.1",
                "--checkpoint-root",
                str(self.checkpoints),
                *self.agent_args,
            ],
            env=self._env(),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.agents[node] = proc
        wait_ready(
            lambda: (
                self.node(node) is not None
                and self.node(node)["state"] == "up"
                and self.node(node)["last_heartbeat"] is not None
            ),
            what=f"agent {node} up",
            proc=proc,
            log=self.root / f"agent-{node}.log",
        )
        return proc

    @classmethod
    @contextlib.contextmanager
    def running(cls, root: Path, agents: dict[str, str], **kw: Any) -> Iterator[Pool]:
        """A started pool with ``agents`` (node -> simulated spec), closed at the end."""
        pool = cls(root, **kw)
        try:
            pool.start_server()
            for node, spec in agents.items():
                pool.start_agent(node, spec)
            yield pool
        finally:
            pool.close()

    def state_dir(self, node: str) -> Path:
        return self.root / "agents" / node

    def kill_agent(self, node: str) -> None:
        proc = self.agents.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in list(self.agents.values()):
            proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.agents.clear()
        self._kill_jobs()
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
        if self.http is not None:
            self.http.close()

    def _kill_jobs(self) -> None:
        """Kill every supervisor and job the agents of this pool left running."""
        kill_left_jobs(self.root / "agents", "*/jobs/*/state.json")

    # -- API
    def post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.http is not None
        r = self.http.post(path, json=body)
        assert r.status_code < 300, f"{path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def get(self, path: str) -> Any:
        assert self.http is not None
        r = self.http.get(path)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
        return r.json()

    def node(self, name: str) -> dict[str, Any] | None:
        assert self.http is not None
        r = self.http.get(f"/v1/nodes/{name}")
        return r.json() if r.status_code == 200 else None

    def submit(self, name: str, *modes: str, **spec: Any) -> str:
        body = {"name": name, "command": [PY, "-c", JOB, str(self.out), *modes], **spec}
        return str(self.post("/v1/jobs", {"spec": body})["job"]["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/v1/jobs/{job_id}"))

    def wait_state(self, job_id: str, *states: str, timeout: float = 60.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            j = self.job(job_id)
            return j if j["state"] in states else None

        try:
            return wait_for(probe, timeout, f"job {job_id} in {states}")
        except AssertionError:
            raise AssertionError(f"job {job_id} is {self.job(job_id)} not in {states}") from None

    def record(self, name: str, rank: int = 0, restart: int = 0) -> dict[str, Any] | None:
        path = self.out / f"{name}.{rank}.{restart}.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def starts(self, name: str) -> list[int]:
        path = self.out / f"{name}.starts"
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def device_nodes(self) -> dict[str, str]:
        return {d["uuid"]: d["node"] for d in self.get("/v1/devices")}
