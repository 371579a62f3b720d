"""Fixtures shared by every test package.

``shared_data`` is ``../shared/data`` beside the project (override with
``GPUPOOL_SHARED_DATA``); tests that need a trace skip with a clear message when it is absent.

`make pytest` runs the suite on several pytest-xdist workers (``pytest -n 4``). Each worker
is given whole modules; :data:`ONE_WORKER` names the test folders whose tests must stay
together on one worker, one test after another, beside the rest of the suite (see
:func:`pytest_xdist_make_scheduler`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPUPOOL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# The pools the suite starts (as root on CI) are one-person pools in private temporary folders,
# which a job running as another account could not enter: their jobs run as the agent's account
# (`--run-as agent`) unless a test names a mode. The tests of who jobs run as (issue 24) start
# their pools without it (tests/e2e/test_hostile_job.py).
os.environ.setdefault("GPUPOOL_RUN_AS", "agent")

#: Tests kept together on one xdist worker, one after another: path prefix -> work unit.
ONE_WORKER = {
    # The session's Kubernetes control plane (etcd, kube-apiserver, scheduler, controller
    # manager, kwok) is the heaviest fixture of the suite: started once, not once per worker.
    "tests/kube/": "kube",
    # Network namespaces, bridges and a /24 of 198.18.0.0/15 picked from the routes present:
    # two workers could pick the same /24 before either adds its route.
    "tests/netns/": "netns",
    # podman: the busybox image is imported once per content (two workers importing the same
    # tag at once race), and the engine's storage lock serialises container starts anyway.
    "tests/containers/": "podman",
    # The dashboard's browser tests share one chromium and one live pool (package-scoped in
    # tests/web/conftest.py), started once when their modules run on the same worker.
    "tests/web/test_dashboard.py": "browser",
    "tests/web/test_modules.py": "browser",
}


def work_unit(nodeid: str) -> str:
    """The unit of work a test is scheduled in under pytest-xdist: its module (module-scoped
    fixtures such as tests/e2e's ``pool`` start once), or the unit :data:`ONE_WORKER` names
    for its path."""
    path = nodeid.split("::", 1)[0]
    for prefix, unit in ONE_WORKER.items():
        if path.startswith(prefix):
            return f"unit:{unit}"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n N` (xdist's ``load``, ``loadscope`` or ``loadgroup``) hands out whole
    :func:`work_unit` s, the biggest first, as xdist's ``loadscope`` does with modules.

    Not ``--dist loadgroup`` with ``xdist_group`` markers: on pytest 9.2 the group suffix that
    xdist adds to a test's node id no longer takes effect, and the tests of a group are spread
    over the workers without a word (pytest-dev/pytest-xdist#1386)."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadgroup"):
        return None  # --dist each, loadfile or worksteal: as asked
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


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


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this pytest run that every xdist worker shares (pytest's own base temporary
    folder without xdist): where a session fixture puts what it builds once for all workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def run_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold the lock ``name`` of a :func:`run_folder` (one worker at a time inside)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
