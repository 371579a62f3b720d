"""Run a real ``gpupool server`` process for end-to-end tests.

    with ServerProcess(home=tmp_path / "home") as server:
        token = server.admin_token()
        httpx.get(server.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})

The server gets a free port, its own ``$GPUPOOL_HOME`` (SQLite there unless ``database_url``
is given), and is ready when ``/readyz`` answers 200: ``start()`` waits for that as long as the
process is alive (see :mod:`tests.readiness`; no clock but a generous failsafe). ``kill()`` sends
SIGKILL (a crash); ``start()`` again restarts it on the same port and home.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from tests.ports import free_port
from tests.readiness import FAILSAFE_S, answers_ready, wait_ready

LAUNCH = "from gpupool.cli.main import main; main()"


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

    def start(self, failsafe_s: float = FAILSAFE_S) -> None:
        args = [sys.executable, "-c", LAUNCH, "server", "--home", str(self.home)]
        args += ["--port", str(self.port), *self.extra_args]
        if self.database_url:
            args += ["--database-url", self.database_url]
        env = {**os.environ, **self.env}
        env.pop("GPUPOOL_DATABASE_URL", None)
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready(failsafe_s)

    def wait_ready(self, failsafe_s: float = FAILSAFE_S) -> None:
        """Wait until ``/readyz`` answers 200 while the process lives (its log if it dies)."""
        wait_ready(
            lambda: answers_ready(self.url),
            what=f"gpupool server on port {self.port}",
            proc=self.proc,
            log=self.log,
            failsafe_s=failsafe_s,
        )

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
