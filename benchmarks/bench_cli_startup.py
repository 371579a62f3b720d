"""CPU time of one ``gpupool`` command, start to end: what a person pays per command.

Usage::

    .venv/bin/python benchmarks/bench_cli_startup.py              # 7 runs per command
    .venv/bin/python benchmarks/bench_cli_startup.py -n 15 --src /tmp/old/src   # another tree

A real ``gpupool server --no-schedule`` on a free port (SQLite in a temporary home) answers
the commands; each command runs ``-n`` times as a fresh ``python -m gpupool.cli`` process and
its user+system CPU time is read from ``wait4`` (the child alone, the server's CPU is not
counted). The figure is the median over the runs (min and max beside it): CPU time, not wall
time, so other processes' load changes it little (beyond cache effects). ``--src`` puts another
source tree first on ``PYTHONPATH`` (e.g. ``git archive 89954b7 src | tar -x -C /tmp/old``) to
measure before and after on one machine; the bare interpreter (``python -c pass``) is the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import Server

#: (label, argv after ``gpupool``); ``python`` is the interpreter alone, for the floor.
COMMANDS: list[tuple[str, list[str]]] = [
    ("python -c pass", []),
    ("gpupool version", ["version"]),
    ("gpupool queue", ["queue"]),
    ("gpupool submit", ["submit", "-J", "bench", "-g", "0.25", "--hold", "--", "true"]),
    ("gpupool gpus", ["gpus"]),
    ("gpupool top --once", ["top", "--once"]),
    ("gpupool queue --help", ["queue", "--help"]),
]


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """User+system CPU seconds of one run of ``argv`` (fails loudly if the command fails)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--runs", type=int, default=7, help="runs per command")
    ap.add_argument("--src", type=Path, help="source tree to measure instead of the installed one")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if args.src:
        env["PYTHONPATH"] = str(args.src.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = Server(home, None, "--no-schedule")
        env.update(GPUPOOL_SERVER=server.url, GPUPOOL_TOKEN=server.token, GPUPOOL_HOME=str(home))
        try:
            head = f"{'command':24} {'median':>8} {'min':>8} {'max':>8}"
            print(f"{head}   CPU seconds, {args.runs} runs")
            for label, rest in COMMANDS:
                argv = [sys.executable, "-c", "pass"] if not rest else [
                    sys.executable, "-m", "gpupool.cli", *rest
                ]  # fmt: skip
                cpu_of(argv, env)  # warm the page cache and .pyc files
                runs = [cpu_of(argv, env) for _ in range(args.runs)]
                print(
                    f"{label:24} {statistics.median(runs):8.3f} {min(runs):8.3f} {max(runs):8.3f}"
                )
        finally:
            server.close()


if __name__ == "__main__":
    main()
