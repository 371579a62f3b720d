"""``gpupool queue`` of 2,000 jobs lists every one, whole and in order, through a pipe and on
a terminal (issue 26: the listing is paged from the API and rendered in linear time; the CPU
figures are in ``benchmarks/bench_cli_startup.py``, not timed here).

A real server (no scheduler, so the jobs stay as submitted) holds 2,000 held jobs, more than
one page of ``GET /v1/jobs`` (1,000); ``python -m gpupool.cli queue`` runs as a user runs it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server_proc import ServerProcess

SRC = Path(__file__).resolve().parents[2] / "src"
COUNT = 2000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def deep_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], list]]:
    server = ServerProcess(tmp_path_factory.mktemp("deep") / "home", extra_args=("--no-schedule",))
    server.start()
    token = server.admin_token()
    try:
        jobs: list[dict[str, object]] = []
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as http:
            while len(jobs) < COUNT:
                body = {
                    "spec": {"name": "deep", "command": ["true"], "resources": {"gpus": "0.1"}},
                    "hold": True,
                    "array": "0-99",
                }
                answer = http.post("/v1/jobs", json=body)
                assert answer.status_code in (200, 201), answer.text
                jobs += answer.json()["array"]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")},
            "GPUPOOL_SERVER": server.url,
            "GPUPOOL_TOKEN": token,
            "GPUPOOL_HOME": str(server.home),
            "PYTHONPATH": str(SRC),
        }
        yield env, jobs
    finally:
        server.stop()


def _rows(text: str) -> list[str]:
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["JOBID", "NAME", "USER"], lines[0]
    assert set(lines[1]) == {"─"}, lines[1]
    return lines[2:]


def _check(rows: list[str], jobs: list[dict[str, object]], whole: bool) -> None:
    assert len(rows) == COUNT
    by_id = {str(j["id"]): j for j in jobs}
    seen = [row.split()[0] for row in rows]
    assert sorted(seen) == sorted(by_id)  # every job, each once
    # queue's order: pending jobs by submit time (then id)
    order = sorted(jobs, key=lambda j: (j["submit_time"], j["id"]))
    assert seen == [j["id"] for j in order]
    for row in rows:
        job = by_id[row.split()[0]]
        cells = row.split()
        assert "PD" in cells
        assert "00:00:00" in cells
        assert "0.1" in cells
        if whole:  # through a pipe every column is there, nothing cut
            assert cells[1] == job["name"]
            assert cells[2:5] == ["admin", "default", "default"]
            assert row.endswith("(JobHeld)")


def test_queue_of_2000_jobs_through_a_pipe_lists_every_job_whole(deep_pool: tuple) -> None:
    env, jobs = deep_pool
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", "queue"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _check(_rows(done.stdout), jobs, whole=True)


def test_queue_of_2000_jobs_on_a_terminal_lists_every_job(deep_pool: tuple) -> None:
    env, jobs = deep_pool
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 100, 0, 0))
    tty_env = {**env, "TERM": "xterm-256color"}
    tty_env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "queue"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=tty_env,
        start_new_session=True,
    )
    os.close(slave)
    out: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            out.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    assert proc.wait(timeout=300) == 0
    reader.join(timeout=60)
    os.close(master)
    text = ANSI.sub("", b"".join(out).decode()).replace("\r\n", "\n")
    rows = _rows(text)
    assert all(len(row) <= 100 for row in rows)  # laid out for the terminal's width
    _check(rows, jobs, whole=False)
