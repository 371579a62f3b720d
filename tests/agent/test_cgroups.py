"""A cgroup v2 per replica, over a stand-in cgroup folder (this machine may have cgroup v1):
the supervisor is placed in it before it starts the job, and its members die with the job.
The kernel's side (moving a process on write, ``cgroup.kill``) is the real machine's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpupool.agent.executor import EXITED, Executor
from gpupool.runtime.cgroups import JobCgroups, open_cgroups
from tests.agent.helpers import wait_for
from tests.agent.test_executor import spec

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_cgroups_are_used_only_with_the_unified_hierarchy(tmp_path: Path) -> None:
    proc_self = tmp_path / "cgroup"
    proc_self.write_text("0::/system.slice/gpupool-agent.service\n")
    v1 = tmp_path / "v1"
    v1.mkdir()
    assert open_cgroups(v1, proc_self) is None
    v2 = tmp_path / "v2"
    (v2 / "system.slice" / "gpupool-agent.service").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    found = open_cgroups(v2, proc_self)
    assert found is not None
    assert found.base == v2 / "system.slice" / "gpupool-agent.service" / "gpupool"


def test_a_replica_runs_in_its_cgroup_and_whatever_is_left_there_dies_with_it(
    tmp_path: Path,
) -> None:
    cgroups = JobCgroups(tmp_path / "cg")
    ex = Executor(tmp_path / "state", cgroups=cgroups)
    ex.launch("r1", spec("import time; time.sleep(600)", tmp_path), {})
    state = wait_for(lambda: ex.jobdir("r1").read_state(), what="the supervisor's state")
    # The supervisor put itself in the replica's cgroup before it started the job.
    assert cgroups.members("r1") == [state.supervisor_pid]
    stray = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        with open(cgroups.path("r1") / "cgroup.procs", "a") as procs:
            procs.write(f"{stray.pid}\n")  # a process that left the job's session
        ex.stop("r1", reason="cancel", signal_name="SIGTERM", grace_s=5)
        wait_for(lambda: ex.observe("r1").status == EXITED, what="the job to end")
        assert stray.pid in ex.kill_leftovers("r1")
        stray.wait(timeout=30)
        assert not _alive(stray.pid)
    finally:
        stray.kill()
        stray.wait()
