"""Run a real ``gpupool server`` process for end-to-end tests.

    with ServerProcess(home=tmp_path / "home") as server:
        token = server.admin_token()
        httpx.get(server.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})

The server gets a free port, its own ``$GPUPOOL_HOME`` (SQLite there unless ``database_url``
is given), and is ready when ``/readyz`` answers 200. ``kill()`` sends SIGKILL (a crash);
``start()`` again restarts it on the same port and home.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

LAUNCH = "from gpupool.cli.main import main; main()"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    def __init__(
        self,
        home: Path,
        *,
        database_url: str | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.home = home
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.extra_args = extra_args
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 30.0) -> None:
        args = [sys.executable, "-c", LAUNCH, "server", "--home", str(self.home)]
        args += ["--port", str(self.port), *self.extra_args]
        if self.database_url:
            args += ["--database-url", self.database_url]
        env = {**os.environ, **self.env}
        env.pop("GPUPOOL_DATABASE_URL", None)
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def admin_token(self) -> str:
        return (self.home / "admin-token").read_text().strip()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, exactly like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
