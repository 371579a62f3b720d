"""``make run`` takes a port and installs only the runtime; ``gpupool up`` reads GPUPOOL_PORT.

The dry runs (``make -n``) read the real Makefile with the venv pointed at a folder that does
not exist, so they show every step a fresh clone's ``make run`` would take; the last test
starts a real ``gpupool up`` with the port only in the environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready

REPO = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [
            "make",
            "-n",
            "--no-print-directory",
            "-C",
            str(REPO),
            *args,
            f"VENV={tmp_path / 'fresh-venv'}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_run_port_starts_the_pool_on_that_port(tmp_path: Path) -> None:
    steps = _dry_run(tmp_path, "run", "PORT=9123")
    assert steps[-1].split() == [f"{tmp_path}/fresh-venv/bin/gpupool", "up", "--port", "9123"]


def test_make_run_installs_the_runtime_not_the_dev_tools(tmp_path: Path) -> None:
    steps = _dry_run(tmp_path, "run")
    installs = [s for s in steps if "pip install" in s and "--upgrade pip" not in s]
    assert installs == [f"{tmp_path}/fresh-venv/bin/python -m pip install --quiet -e ."]
    # ... while make test installs the dev tools.
    tests = _dry_run(tmp_path, "test")
    assert any("-e '.[dev]'" in s for s in tests)


def test_gpupool_up_listens_on_gpupool_port(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "GPUPOOL_HOME": str(tmp_path / "home"), "GPUPOOL_PORT": str(port)}
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli", "up", "--simulate", "1xT4"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda: answers_ready(url), what="gpupool up", proc=proc, log=log)
        assert httpx.get(url + "/v1/version", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert f"dashboard http://127.0.0.1:{port}/" in log.read_text()
