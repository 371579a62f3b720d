"""CPU time of one ``gpupool`` command, start to end: what a person pays per command.

Usage::

    .venv/bin/python benchmarks/bench_cli_startup.py              # 7 runs per command
    .venv/bin/python benchmarks/bench_cli_startup.py -n 15 --src /tmp/old/src   # another tree
    .venv/bin/python benchmarks/bench_cli_startup.py --deep 0     # without the 2,000-job queue

A real ``gpupool server --no-schedule`` on a free port (SQLite in a temporary home) answers
the commands; each command runs ``-n`` times as a fresh ``python -m gpupool.cli`` process and
its user+system CPU time is read from ``wait4`` (the child alone, the server's CPU is not
counted). The figure is the median over the runs (min and max beside it): CPU time, not wall
time, so other processes' load changes it little (beyond cache effects). ``--src`` puts another
source tree first on ``PYTHONPATH`` (e.g. ``git archive 89954b7 src | tar -x -C /tmp/old``) to
measure before and after on one machine; the bare interpreter (``python -c pass``) is the floor.
``PYTHONDONTWRITEBYTECODE`` is dropped from the commands' environment, so that the warm-up run
writes the ``.pyc`` files an installed gpupool has.

``cancel`` cancels a different held job each run (made through the API beforehand), ``show``
shows one. Then ``--deep`` held jobs (default 2,000; issue 26) are added through the API and
``gpupool queue`` lists them all, once through a pipe (its whole output read) and once on a
terminal (a pseudo-terminal 120 columns wide, as ``script -qc`` gives one).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import Server

#: (label, argv after ``gpupool``); ``python`` is the interpreter alone, for the floor.
#: ``{job}`` is a held job (``show``), ``{next}`` a new held job each run (``cancel``).
COMMANDS: list[tuple[str, list[str]]] = [
    ("python -c pass", []),
    ("gpupool version", ["version"]),
    ("gpupool queue", ["queue"]),
    ("gpupool submit", ["submit", "-J", "bench", "-g", "0.25", "--hold", "--", "true"]),
    ("gpupool cancel", ["cancel", "{next}"]),
    ("gpupool show", ["show", "{job}"]),
    ("gpupool gpus", ["gpus"]),
    ("gpupool top --once", ["top", "--once"]),
    ("gpupool queue --help", ["queue", "--help"]),
]


def _drain(fd: int, sink: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other end closed
            return
        if not chunk:
            return
        sink.append(chunk)


def cpu_of(argv: list[str], env: dict[str, str], *, tty: bool = False) -> tuple[float, bytes]:
    """User+system CPU seconds of one run of ``argv``, and what it printed (fails loudly if
    the command fails). ``tty``: on a pseudo-terminal 120 columns wide, else through a pipe."""
    out: list[bytes] = []
    if tty:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        env = {**env, "TERM": "xterm-256color"}
        env.pop("COLUMNS", None)
        proc = subprocess.Popen(argv, env=env, stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        reader = threading.Thread(target=_drain, args=(master, out))
    else:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        reader = threading.Thread(target=_drain, args=(proc.stdout.fileno(), out))
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join()
    if tty:
        os.close(master)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err}")
    return usage.ru_utime + usage.ru_stime, b"".join(out)


def held_jobs(server: Server, count: int, name: str) -> list[str]:
    """``count`` held jobs submitted through the API (100 per array submit); their ids."""
    ids: list[str] = []
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http:
        while len(ids) < count:
            n = min(100, count - len(ids))
            body = {
                "spec": {"name": name, "command": ["true"], "resources": {"gpus": "0.1"}},
                "hold": True,
                "array": f"0-{n - 1}",
            }
            answer = http.post("/v1/jobs", json=body)
            answer.raise_for_status()
            ids += [t["id"] for t in answer.json()["array"]]
    return ids


def row(label: str, runs: list[float]) -> None:
    print(f"{label:28} {statistics.median(runs):8.3f} {min(runs):8.3f} {max(runs):8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--runs", type=int, default=7, help="runs per command")
    ap.add_argument("--src", type=Path, help="source tree to measure instead of the installed one")
    ap.add_argument("--deep", type=int, default=2000, help="jobs for the deep queue (0: none)")
    args = ap.parse_args()
    # .pyc files as an installed gpupool has them: the warm-up run writes them (without them
    # every run compiles every module it imports, several times the cost measured here)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUPOOL_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    if args.src:
        env["PYTHONPATH"] = str(args.src.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = Server(home, None, "--no-schedule")
        env.update(GPUPOOL_SERVER=server.url, GPUPOOL_TOKEN=server.token, GPUPOOL_HOME=str(home))
        try:
            to_cancel = iter(held_jobs(server, args.runs + 1, "bench-cancel"))
            job = held_jobs(server, 1, "bench-show")[0]
            head = f"{'command':28} {'median':>8} {'min':>8} {'max':>8}"
            print(f"{head}   CPU seconds, {args.runs} runs")
            gpupool = [sys.executable, "-m", "gpupool.cli"]
            for label, rest in COMMANDS:

                def argv(rest: list[str] = rest) -> list[str]:
                    if not rest:
                        return [sys.executable, "-c", "pass"]
                    words = [w.replace("{job}", job) for w in rest]
                    return gpupool + [next(to_cancel) if w == "{next}" else w for w in words]

                cpu_of(argv(), env)  # warm the page cache and .pyc files
                row(label, [cpu_of(argv(), env)[0] for _ in range(args.runs)])
            if args.deep:
                deep(server, env, gpupool, args)
        finally:
            server.close()


def deep(server: Server, env: dict[str, str], gpupool: list[str], args: argparse.Namespace) -> None:
    """``gpupool queue`` of ``--deep`` held jobs, through a pipe and on a terminal."""
    ids = set(held_jobs(server, args.deep, "deep"))
    listed: Callable[[bytes], int] = lambda out: sum(j.encode() in out for j in ids)  # noqa: E731
    for label, tty in (
        (f"queue, {args.deep} jobs, pipe", False),
        (f"queue, {args.deep}, tty", True),
    ):
        cpu_of([*gpupool, "queue"], env, tty=tty)
        runs = []
        for _ in range(max(3, args.runs // 2)):
            cpu, out = cpu_of([*gpupool, "queue"], env, tty=tty)
            if listed(out) != len(ids):
                raise SystemExit(f"{label}: {listed(out)} of {len(ids)} jobs listed")
            runs.append(cpu)
        row(label, runs)


if __name__ == "__main__":
    main()
