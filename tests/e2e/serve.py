"""Start ``gpupool server`` for the end-to-end pool: ``python -m tests.e2e.serve ARGS``.

The scheduler's anti-loop exemption (``--preempt-exempt``, 300 s by default: a job is never
preempted in its first five minutes) would make a preemption test wait five minutes, so this
launcher adds ``--preempt-exempt $GPUPOOL_TEST_PREEMPT_EXEMPT_S`` (default 0) to the real
server's arguments and changes nothing else.
"""

from __future__ import annotations

import os
import sys

from gpupool.cli.main import main

exempt = os.environ.get("GPUPOOL_TEST_PREEMPT_EXEMPT_S", "0")
sys.argv = ["gpupool", *sys.argv[1:], "--preempt-exempt", exempt]
main()
