"""``gpupool queue``, ``gpus`` and ``top`` in a real terminal (a pty) 80, 100 and 120 columns
wide, over a live pool; and ``top`` through a server restart.

In a terminal rich used to squeeze every column, so at 100 columns ``queue`` showed only
``… NAME NODELIST(REASON)``. Now each table fits the width it is printed at
(:mod:`gpupool.cli.fit`): job id, state, time and slice stay whole, the reason is cut last.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.cli import render
from gpupool.client import Client
from gpupool.domain.states import JobState
from tests.api.server_proc import ServerProcess
from tests.cli.conftest import LocalPool
from tests.readiness import FAILSAFE_S

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")
REPO = Path(__file__).resolve().parents[2]


def _spawn(
    args: list[str], env: dict[str, str], columns: int
) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**env, "TERM": "xterm-256color", "PYTHONPATH": str(REPO)}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


def _read(fd: int, until: bytes | None = None) -> bytes:
    """What the terminal shows until ``until`` appears (or the program closes it)."""
    seen = b""
    started = time.monotonic()
    while until is None or until not in ANSI.sub(b"", seen):
        assert time.monotonic() - started < FAILSAFE_S, f"never saw {until!r}: {seen[-600:]!r}"
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the program ended and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def in_terminal(args: list[str], env: dict[str, str], columns: int) -> list[str]:
    """The lines ``gpupool ARGS`` prints in a terminal ``columns`` wide, colour removed."""
    proc, master = _spawn(args, env, columns)
    try:
        out = _read(master)
        assert proc.wait(timeout=FAILSAFE_S) == 0, out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return ANSI.sub(b"", out).decode().replace("\r", "").splitlines()


@pytest.fixture
def jobs(pool_env: LocalPool) -> Iterator[list[str]]:
    """A running job with a long name and a held (pending) one, cancelled afterwards."""
    with Client(pool_env.url, pool_env.admin_token) as gp:
        running = gp.submit(
            {
                "name": "preprocess-imagenet-shards-for-the-resnet-baseline",
                "command": ["sleep", "600"],
                "resources": {"gpus": "0.25"},
            }
        ).id
        held = gp.submit(
            {"name": "held-eval", "command": ["true"], "resources": {"gpus": "0.5"}}, hold=True
        ).id
        gp.wait(running, until=frozenset({JobState.RUNNING}), timeout_s=FAILSAFE_S, poll_s=0.2)
        try:
            yield [running, held]
        finally:
            for job_id in (running, held):
                gp.cancel(job_id)


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_queue_in_a_terminal_keeps_job_id_state_time_and_slice_whole(
    pool_env: LocalPool, jobs: list[str], columns: int
) -> None:
    env = {**os.environ, "GPUPOOL_TOKEN": pool_env.admin_token}
    lines = in_terminal(["queue"], env, columns)
    assert max(len(x) for x in lines) <= columns, lines
    assert lines[0].split()[:2] == ["JOBID", "NAME"]
    with Client(pool_env.url, pool_env.admin_token) as gp:
        views = {j.id: j for j in gp.list(limit=50)}
    for job_id in jobs:
        line = next(x for x in lines if x.startswith(job_id))
        job = views[job_id]
        assert f" {job.state_code} " in line, line
        assert re.search(r" \d\d:\d\d:\d\d ", line), line
        assert f" {render.gpu_slice(job)} " in line, line


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_gpus_in_a_terminal_keep_node_and_index(pool_env: LocalPool, columns: int) -> None:
    env = {**os.environ, "GPUPOOL_TOKEN": pool_env.admin_token}
    lines = in_terminal(["gpus"], env, columns)
    assert max(len(x) for x in lines) <= columns, lines
    rows = [x.split() for x in lines[2:] if x.strip()]
    assert sorted((r[0], r[1]) for r in rows) == [("sim-1", "0"), ("sim-1", "1"), ("sim-1", "2")]


def test_top_in_a_terminal_lists_the_queue(pool_env: LocalPool, jobs: list[str]) -> None:
    env = {**os.environ, "GPUPOOL_TOKEN": pool_env.admin_token}
    proc, master = _spawn(["top", "-d", "0.5"], env, 100)
    try:
        shown = _read(master, until=b"held-eval")
        assert jobs[1].encode() in ANSI.sub(b"", shown)
        os.write(master, b"q")
        assert proc.wait(timeout=FAILSAFE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_top_keeps_running_through_a_server_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "home")
    server.start()
    env = {**os.environ, "GPUPOOL_SERVER": server.url, "GPUPOOL_TOKEN": server.admin_token()}
    proc, master = _spawn(["top", "-d", "0.5"], env, 100)
    try:
        _read(master, until=b"devices 0")
        server.kill()
        _read(master, until=b"disconnected from " + server.url.encode())
        assert proc.poll() is None, "top ended when the server went away"
        server.start()
        # Fresh data after the restart: a job submitted now shows in top's queue.
        with Client(server.url, server.admin_token()) as gp:
            job_id = gp.submit({"name": "after-restart", "command": ["true"]}, hold=True).id
        _read(master, until=job_id.encode())
        os.write(master, b"q")
        assert proc.wait(timeout=FAILSAFE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        server.stop()
