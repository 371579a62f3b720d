"""A live pool for the CLI and SDK tests: one ``gpupool server`` process and one
``gpupool agent`` with simulated GPUs (2 x A100-80GB, 1 x T4), in a temporary ``$GPUPOOL_HOME``.

It reuses the end-to-end ``Pool`` (tests/e2e/pool.py) with the agent's state folder under
``$GPUPOOL_HOME/agent/<node>``, where a standalone pool keeps it, so ``gpupool logs`` finds the
job output. ``cli`` runs a command in-process with typer's runner, the server and token coming
from the environment as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from tests.e2e.pool import Pool


class LocalPool(Pool):
    """The e2e pool with agent state where a standalone pool keeps it."""

    def state_dir(self, node: str) -> Path:
        return self.home / "agent" / node

    def _kill_jobs(self) -> None:
        for state in (self.home / "agent").glob("*/jobs/*/state.json"):
            try:
                data = json.loads(state.read_text())
            except (OSError, ValueError):
                continue
            for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                if data.get(key):
                    with contextlib.suppress(OSError):
                        kill(int(data[key]), signal.SIGKILL)

    @property
    def admin_token(self) -> str:
        return (self.home / "admin-token").read_text().strip()


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def live_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPool]:
    p = LocalPool(tmp_path_factory.mktemp("clipool"))
    try:
        p.start_server()
        p.start_agent("sim-1", "2xA100-80GB,1xT4")
        yield p
    finally:
        p.close()


@pytest.fixture
def pool_env(live_pool: LocalPool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> LocalPool:
    """Point discovery at the live pool as a standalone one: $GPUPOOL_HOME, no other config."""
    monkeypatch.setenv("GPUPOOL_HOME", str(live_pool.home))
    monkeypatch.setenv("GPUPOOL_SERVER", live_pool.url)
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("COLUMNS", "200")
    return live_pool


@pytest.fixture
def cli() -> object:
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        r = runner.invoke(app, list(args), env=env, catch_exceptions=False)
        return Result(r.exit_code, r.stdout, r.stderr)

    return invoke
