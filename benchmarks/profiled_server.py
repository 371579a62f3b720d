"""``gpupool server`` with a profiler switched by signals (``bench_fleet.py --profile``).

    python benchmarks/profiled_server.py OUT.prof server --home ...   # the CLI's arguments

``SIGUSR1`` starts :mod:`cProfile` on the main thread (the event loop: routing, the quiet
heartbeat path, long polls, the liveness batcher's scheduling); ``SIGUSR2`` stops it and writes
the statistics to ``OUT.prof`` (read them with ``python -m pstats OUT.prof``). Worker threads
(full heartbeats, the scheduling loop) are not profiled: the quiet fleet's cost is on the loop.
The timer is the thread's CPU time (wall time would count the moments the loop was preempted,
e.g. in a write that woke the client). The profiler slows what it measures; compare the
shares of its rows, not the server's CPU.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from types import FrameType

from gpupool.cli.main import main as cli_main

profiler = cProfile.Profile(time.thread_time)  # CPU time: a write preempted is not counted


def start(_sig: int, _frame: FrameType | None) -> None:
    profiler.enable()


def stop(out: str) -> None:
    profiler.disable()
    profiler.dump_stats(out)


if __name__ == "__main__":
    out = sys.argv.pop(1)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, lambda sig, frame: stop(out))
    cli_main()
