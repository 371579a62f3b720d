"""Start ``gpupool server`` with test scheduler settings: ``python -m tests.e2e.serve ARGS``.

The server has no option yet for the scheduler's anti-loop exemption (``preempt_exempt_s``,
300 s by default: a job is never preempted in its first five minutes), which would make a
preemption test wait five minutes. This launcher runs the real server process with that
exemption set from ``$GPUPOOL_TEST_PREEMPT_EXEMPT_S`` (default 0) and changes nothing else.
"""

from __future__ import annotations

import functools
import os
import sys

import gpupool.control.loop as loop
from gpupool.cli.main import main

loop.SchedulerConfig = functools.partial(  # type: ignore[misc]
    loop.SchedulerConfig,
    preempt_exempt_s=float(os.environ.get("GPUPOOL_TEST_PREEMPT_EXEMPT_S", "0")),
)
sys.argv = ["gpupool", *sys.argv[1:]]
main()
