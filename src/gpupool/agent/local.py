"""The local agent of ``gpupool up``: the same agent, run in a thread beside the server.

It waits for the server to answer ``/readyz``, gets itself an agent token through the API with
the admin token (kept in ``$GPUPOOL_HOME/agent-token``, mode 0600, reused while it is valid),
and runs :class:`~gpupool.agent.agent.Agent` with real GPUs when a driver is present, simulated
ones otherwise (``DEFAULT_SIMULATE``, or ``simulate`` to choose). Its state folder is
``$GPUPOOL_HOME/agent/<node>``, so a restarted ``gpupool up`` re-adopts the jobs that kept
running. With ``run_as`` (``gpupool up --run-as``) its jobs run as another account, as with
``gpupool agent --run-as`` (see agent/runas.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.agent.fence import Fence
from gpupool.agent.node import default_node_name
from gpupool.agent.runas import AUTO, check_mode, protect_state
from gpupool.agent.transport import AgentRejected, HttpTransport
from gpupool.control.machinery.clock import Clock, SystemClock
from gpupool.domain.errors import GpupoolError
from gpupool.gpu import open_backend

log = logging.getLogger("gpupool.agent.local")

#: What ``gpupool up`` simulates on a machine without an NVIDIA driver.
DEFAULT_SIMULATE = "4xA100-80GB"
LOCAL_AGENT_USER = "local-agent"


def _write_secret(path: Path, secret: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that was already there keeps its mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secret + "\n")


def ensure_agent_token(url: str, admin_token: str, path: Path) -> str:
    """A working agent token: the one in ``path`` if the server still takes it, else a new one."""
    if path.exists():
        secret = path.read_text(encoding="utf-8").strip()
        r = httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
        if r.status_code == 200 and r.json().get("role") == "agent":
            return secret
    admin = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=url, headers=admin, timeout=20) as http:
        r = http.post("/v1/users", json={"name": LOCAL_AGENT_USER, "role": "agent"})
        if r.status_code not in (200, 201, 409):
            raise GpupoolError(f"cannot create the local agent user: {r.status_code} {r.text}")
        r = http.post("/v1/tokens", json={"user": LOCAL_AGENT_USER, "name": "gpupool up"})
        if r.status_code != 201:
            raise GpupoolError(f"cannot create the local agent token: {r.status_code} {r.text}")
        secret = str(r.json()["secret"])
    _write_secret(path, secret)
    return secret


class LocalAgent:
    """Runs the node agent in a background thread until :meth:`stop`."""

    def __init__(
        self,
        *,
        home: Path,
        url: str,
        admin_token_path: Path,
        simulate: str | None = None,
        seed: int = 0,
        clock: Clock | None = None,
        announce: Callable[[str], None] = log.info,
        run_as: str = AUTO,
    ) -> None:
        self.home = home
        self.url = url
        self.admin_token_path = admin_token_path
        self.simulate = simulate
        self.seed = seed
        self.clock = clock or SystemClock()
        self.announce = announce
        self.run_as = run_as
        self.node = default_node_name()
        self.state_dir = home / "agent" / self.node
        self.agent: Agent | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gpupool-local-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _wait_ready(self) -> bool:
        while not self._stop.is_set():
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            self._stop.wait(0.2)
        return False

    def _main(self) -> None:
        try:
            if not self._wait_ready():
                return
            admin = self.admin_token_path.read_text(encoding="utf-8").strip()
            token = ensure_agent_token(self.url, admin, self.home / "agent-token")
            backend = open_backend(
                node=self.node,
                simulate=self.simulate,
                seed=self.seed,
                fallback=DEFAULT_SIMULATE,
            )
            self.state_dir.mkdir(parents=True, exist_ok=True)
            reachable = [self.state_dir / "work", self.state_dir / "checkpoints"]
            protect_state(self.run_as, self.state_dir, reachable, below=self.home)
            check_mode(self.run_as, reachable)
            config = AgentConfig(
                node=self.node, state_dir=self.state_dir, address="127.0.0.1", run_as=self.run_as
            )
            self.agent = Agent(config, backend, HttpTransport(self.url, token), self.clock)
            kinds = ", ".join(sorted({d.name for d in self.agent.inventory}))
            self.announce(
                f"local agent: node {self.node}, {len(self.agent.devices)} {backend.name} "
                f"GPU(s) ({kinds}); jobs and logs under {self.state_dir}"
            )
            try:
                self.agent.run(self._stop)
            finally:
                self.agent.close()
                # The server stops with this agent: its jobs wait for both, unfenced.
                with contextlib.suppress(OSError):
                    Fence.stand_down(self.state_dir)
        except (GpupoolError, AgentRejected, OSError, httpx.HTTPError) as exc:
            self.error = str(exc)
            log.error("the local agent stopped: %s", exc)
