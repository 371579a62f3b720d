"""Every job's supervisor starts light: it imports no ``typing``, ``dataclasses`` or server.

A replica's start pays for a fresh interpreter (:mod:`gpupool.agent.supervisor`); with 40 short
jobs starting at once on two cores the supervisors' imports were most of the time from
placement to RUNNING (``docs/benchmarks.md``, the short-job drain): about 57 ms of CPU each
against 14 ms for ``python -c pass``. These tests launch real jobs through the executor, with
the supervisor's interpreter run under ``-X importtime`` (a wrapper given as the executor's
``python``), and read which modules it imported from its log. Not timed: the CPU figures are
from ``benchmarks/bench_live_loop.py`` and the command in that section.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from gpupool.agent.executor import EXITED, Executor, Observed
from gpupool.agent.jobdir import BOOT_FAILED, LaunchSpec, ProcessState
from tests.agent.helpers import wait_for

#: What a supervisor must not import: each costs start-up time on every job (``typing`` and
#: ``dataclasses``, which pulls ``inspect``; ``pathlib`` pulls ``fnmatch`` and ``urllib``) or
#: belongs to another process altogether (the server, the store, the wire models, the agent).
HEAVY = (
    "typing",
    "dataclasses",
    "inspect",
    "pathlib",
    "pydantic",
    "httpx",
    "sqlalchemy",
    "fastapi",
    "gpupool.agent.jobdir",
    "gpupool.agent.executor",
    "gpupool.agent.agent",
    "gpupool.control",
    "gpupool.schemas",
    "gpupool.client",
)


def _importtime_python(tmp: Path) -> str:
    """An interpreter for the executor that records the modules it imports in its stderr."""
    wrapper = tmp / "python-importtime"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -X importtime "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def _modules_in(log: Path) -> set[str]:
    """The modules an ``-X importtime`` log lists (``import time: self | cumulative | name``)."""
    names = set()
    for line in log.read_text().splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name)
    return names


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def _finished(ex: Executor, key: str) -> Observed | None:
    seen = ex.observe(key)
    return seen if seen.status in (EXITED, BOOT_FAILED) else None


def test_a_job_runs_under_a_supervisor_that_imports_no_typing_dataclasses_or_server(
    tmp_path: Path,
) -> None:
    ex = Executor(tmp_path / "state", python=_importtime_python(tmp_path), cgroups=False)
    launch = LaunchSpec(
        argv=[sys.executable, "-c", "print('hello')"],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        time_limit_s=60.0,
    )
    ex.launch("a1", launch, {})
    result = wait_for(lambda: _finished(ex, "a1"), timeout=120, what="the job to end")
    assert result.status == EXITED
    assert result.exit_code == 0
    assert ex.jobdir("a1").stdout.read_text() == "hello\n"
    modules = _modules_in(ex.jobdir("a1").path / "supervisor.log")
    assert _heavy(modules) == []
    assert "gpupool.runtime.procs" in modules  # the log was read: the supervisor's own imports


def test_a_job_stopped_by_the_agent_runs_under_a_light_supervisor_too(tmp_path: Path) -> None:
    ex = Executor(tmp_path / "state", python=_importtime_python(tmp_path), cgroups=False)
    launch = LaunchSpec(
        argv=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        grace_s=30.0,
    )
    ex.launch("a1", launch, {})
    out = ex.jobdir("a1").stdout
    wait_for(
        lambda: (out.exists() and out.read_text() == "up\n") or None, timeout=120, what="the job up"
    )
    assert ex.stop("a1", reason="cancel", signal_name="SIGTERM", grace_s=30.0)
    result = wait_for(lambda: _finished(ex, "a1"), timeout=120, what="the job to stop")
    assert result.stop_reason == "cancel"
    assert result.signal == "SIGTERM"
    assert _heavy(_modules_in(ex.jobdir("a1").path / "supervisor.log")) == []


def test_a_launch_file_the_supervisor_cannot_read_is_a_boot_failure_naming_the_key(
    tmp_path: Path,
) -> None:
    """A ``launch.json`` with a key no launch record has (written by a newer agent, or by hand)
    is recorded as a boot failure that says which key, not a supervisor traceback."""
    folder = tmp_path / "a1"
    folder.mkdir()
    record = {"argv": ["true"], "env": {}, "cwd": str(tmp_path), "priority": 3}
    (folder / "launch.json").write_text(json.dumps(record))
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.agent.supervisor", str(folder)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    state = json.loads((folder / "state.json").read_text())
    assert state["status"] == BOOT_FAILED
    assert state["reason"] == "launch.json is not a launch record: unknown priority"
    assert ProcessState.from_json(state).finished


def test_import_gpupool_is_light_and_its_public_names_still_load() -> None:
    code = (
        "import json, sys\n"
        "import gpupool\n"
        "light = sorted(sys.modules)\n"
        "assert gpupool.__version__\n"
        "client = gpupool.Client\n"
        "try:\n"
        "    gpupool.no_such_name\n"
        "except AttributeError as exc:\n"
        "    missing = str(exc)\n"
        "print(json.dumps({'light': light, 'client': client.__name__, 'missing': missing}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "typing" not in seen["light"]
    assert [m for m in seen["light"] if m.startswith("gpupool")] == ["gpupool"]
    assert seen["client"] == "Client"
    assert seen["missing"] == "module 'gpupool' has no attribute 'no_such_name'"


def test_the_supervisors_file_format_matches_the_agents_typed_view() -> None:
    """:mod:`gpupool.agent.jobfiles` (the supervisor's) and :mod:`gpupool.agent.jobdir` (the
    agent's) describe one format: the same state keys and the same launch defaults."""
    from gpupool.agent import jobfiles

    state_keys = [f for f in ProcessState.__dataclass_fields__ if f != "extra"]
    assert tuple(state_keys) == jobfiles.STATE_FIELDS
    filled = jobfiles.launch_record({"argv": ["true"], "env": {}, "cwd": "/"})
    assert filled == LaunchSpec(argv=["true"], env={}, cwd="/").to_json()
    assert LaunchSpec.from_json(filled) == LaunchSpec(argv=["true"], env={}, cwd="/")
