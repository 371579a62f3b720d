"""``gpupool server`` and ``gpupool up`` refuse numbers they cannot run with, in one line.

A ``--heartbeat nan`` or ``--node-timeout 1e400`` used to start a server whose node timeout
never (or always) fired; the settings are now bounded like every number that enters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--heartbeat", "nan"), "heartbeat"),
        (("--heartbeat", "0"), "heartbeat"),
        (("--node-timeout", "1e400"), "node timeout"),
        (("--node-timeout", "1", "--heartbeat", "5"), "node timeout"),
        (("--preempt-exempt", "-5"), "preempt"),
        (("--port", "70000"), "port"),
    ],
)
def test_gpupool_server_with_an_impossible_number_exits_with_one_line(
    tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    _refuses(tmp_path, "server", flags, says)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--heartbeat", "nan"), "heartbeat"),
        (("--node-timeout", "1", "--heartbeat", "5"), "node timeout"),
        (("--node-timeout", "-3"), "node timeout"),
    ],
)
def test_gpupool_up_with_an_impossible_number_exits_with_one_line_and_starts_no_agent(
    tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    _refuses(tmp_path, "up", (*flags, "--simulate", "1xT4"), says)
    assert not (tmp_path / "home" / "agent").exists()  # no local agent was started


def _refuses(tmp_path: Path, command: str, flags: tuple[str, ...], says: str) -> None:
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "home")}
    env.pop("GPUPOOL_DATABASE_URL", None)
    cmd = [sys.executable, "-m", "gpupool.cli", command, "--home", str(tmp_path / "home")]
    cmd += ["--port", str(free_port()), *flags]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpupool {command} {' '.join(flags)} started instead of refusing")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    assert says in lines[0]
