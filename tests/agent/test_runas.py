"""Jobs run as their submitters' Unix accounts (``gpupool agent --run-as submitter``).

The end-to-end cases start real supervisors that switch to the ``nobody`` account, so they need
root (as CI has) and skip with the reason otherwise.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.agent import Agent
from gpupool.agent.config import AgentConfig
from gpupool.agent.runas import SUBMITTER, NoAccount, account_for, check_mode
from gpupool.control.machinery.clock import SystemClock
from gpupool.domain.errors import GpupoolError
from gpupool.gpu.simulated import SimulatedBackend
from gpupool.schemas.agent import ReplicaState
from tests.agent.test_agent import FakeServer, assignment, drive

# A shell, not this interpreter: the test's Python may live where ``nobody`` cannot go.
WHO = 'printf "%s\\n" "$(id -u)" "$(id -g)" "$(id -G)" "$HOME" "$USER" "$LOGNAME" "$PWD" > "$1"'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' account")


def test_a_user_maps_to_the_unix_account_of_the_same_name() -> None:
    entry = _nobody()
    account = account_for("nobody", "n1")
    assert (account.uid, account.gid, account.home) == (entry.pw_uid, entry.pw_gid, entry.pw_dir)
    assert entry.pw_gid in account.groups
    assert account.env() == {"HOME": entry.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}


def test_no_account_root_or_no_user_is_refused_with_what_to_do() -> None:
    with pytest.raises(NoAccount, match="no Unix account 'gp-nobody-here' on node n1: create"):
        account_for("gp-nobody-here", "n1")
    with pytest.raises(NoAccount, match="jobs never run as root"):
        account_for("root", "n1")
    with pytest.raises(NoAccount, match="names no submitting user"):
        account_for("", "n1")


def test_a_bad_mode_or_a_closed_folder_stops_the_agent_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(GpupoolError, match="choose one of auto, agent, submitter"):
        check_mode("everyone", [])
    closed = tmp_path / "closed"
    (closed / "state").mkdir(parents=True)
    closed.chmod(0o700)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(GpupoolError, match=f"{closed} does not let others pass"):
        check_mode(SUBMITTER, [closed / "state" / "work"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(GpupoolError, match="needs the agent to run as root"):
        check_mode(SUBMITTER, [])
    check_mode("agent", [closed / "state"])  # the agent's own account needs nothing


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder others may pass through (pytest's own tmp folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-runas-", dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _agent(root: Path, server: FakeServer) -> Agent:
    config = AgentConfig(node="n1", state_dir=root / "state", local_tick_s=0.05, run_as=SUBMITTER)
    check_mode(SUBMITTER, [root / "state" / "work", root / "state" / "checkpoints"])
    return Agent(
        config, SimulatedBackend.from_spec("1xA100-80GB", node="n1"), server, SystemClock()
    )


@needs_root
def test_a_job_runs_as_its_submitter_in_folders_of_its_own(open_tmp: Path) -> None:
    entry = _nobody()
    out = open_tmp / "out"
    out.mkdir()
    out.chmod(0o777)
    server = FakeServer()
    agent = _agent(open_tmp, server)
    agent.register()
    command = ["/bin/sh", "-c", WHO, "who", str(out / "who")]
    assert agent.apply_start(assignment("r1", open_tmp, user="nobody", command=command))
    done = drive(agent, server, "r1", ReplicaState.EXITED)
    assert done.exit_code == 0, done.reason
    uid, gid, groups, home, user, logname, cwd = (out / "who").read_text().splitlines()
    assert (int(uid), int(gid)) == (entry.pw_uid, entry.pw_gid)
    assert "0" not in groups.split()  # root's groups are not kept
    assert (home, user, logname) == (entry.pw_dir, "nobody", "nobody")
    for folder in (Path(cwd), open_tmp / "state" / "checkpoints" / "job-r1"):
        info = folder.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (entry.pw_uid, 0o700), folder
    # The supervisor's records stay the agent's: the job cannot rewrite its own exit code.
    state = open_tmp / "state" / "jobs" / "r1" / "state.json"
    assert state.stat().st_uid == os.geteuid()


@needs_root
def test_a_submitter_without_an_account_is_a_boot_failure(open_tmp: Path) -> None:
    server = FakeServer()
    agent = _agent(open_tmp, server)
    agent.register()
    assert agent.apply_start(assignment("r2", open_tmp, user="gp-nobody-here"))
    agent.observe()
    agent.heartbeat()
    seen = server.last("r2")
    assert seen is not None
    assert seen.state is ReplicaState.BOOT_FAILED
    assert "no Unix account 'gp-nobody-here' on node n1" in (seen.reason or "")


def test_auto_started_by_an_ordinary_user_is_that_users_own_pool_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpupool.agent.runas import AGENT, AUTO, resolve_mode, switches_account
    from gpupool.cli.agent import jobs_run_as

    entry = _nobody()
    monkeypatch.setattr(os, "geteuid", lambda: entry.pw_uid)
    assert resolve_mode(AUTO) == AGENT
    assert not switches_account(AUTO)
    said = jobs_run_as(AUTO, "the admin token")
    assert said.startswith(f"this is your own pool: jobs run as {entry.pw_name}, this process")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert resolve_mode(AUTO) == AUTO
    assert "never as root or as this process's account" in jobs_run_as(AUTO, "x")
    assert "one account for every tenant" in jobs_run_as("gpupool-job", "x")
