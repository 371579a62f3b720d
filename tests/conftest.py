"""Fixtures shared by every test package.

``shared_data`` is ``../shared/data`` beside the project (override with
``GPUPOOL_SHARED_DATA``); tests that need a trace skip with a clear message when it is absent.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPUPOOL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# The pools the suite starts (as root on CI) are one-person pools in private temporary folders,
# which a job running as another account could not enter: their jobs run as the agent's account
# (`--run-as agent`) unless a test names a mode. The tests of who jobs run as (issue 24) start
# their pools without it (tests/e2e/test_hostile_job.py).
os.environ.setdefault("GPUPOOL_RUN_AS", "agent")
# Tests press Ctrl-C on the CLI processes they start (`run`, `alloc`, `up`) as a person at a
# terminal does. A suite started as a background job of a non-interactive shell (`make test &`,
# some CI runners) begins with SIGINT ignored, and an ignored signal is inherited through exec:
# every child would ignore the Ctrl-C. Python's own handler here is reset to the default in each
# child instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The public GPU traces folder; skips the test when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared trace data not found at {SHARED_DATA} (set GPUPOOL_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def alibaba_csv(shared_data: Path) -> Path:
    """``alibaba-gpu-v2023/csv`` with the node list and pod lists."""
    path = shared_data / "alibaba-gpu-v2023" / "csv"
    if not path.is_dir():
        pytest.skip(f"Alibaba v2023 trace not found at {path}")
    return path
