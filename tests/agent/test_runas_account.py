"""``--run-as ACCOUNT`` (one service account for every job) and the checks that keep an agent's
credentials out of its jobs' reach (agent/runas.py). The live path is
``tests/e2e/test_job_credentials.py``; these pin each refusal and its advice."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.agent.runas import (
    AGENT,
    SUBMITTER,
    NoAccount,
    check_mode,
    check_token_file,
    job_account,
    protect_state,
    service_account,
)
from gpupool.domain.errors import GpupoolError


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' account")


def test_a_named_account_runs_every_job_and_the_modes_keep_their_meaning() -> None:
    entry = _nobody()
    account = service_account("nobody")
    assert account is not None
    assert (account.name, account.uid, account.gid) == ("nobody", entry.pw_uid, entry.pw_gid)
    assert job_account("nobody", "alice", "n1") == account  # whoever submitted
    assert job_account(AGENT, "alice", "n1") is None
    assert service_account(SUBMITTER) is None
    with pytest.raises(NoAccount, match="no Unix account 'gp-nobody-here' on node n1"):
        job_account(SUBMITTER, "gp-nobody-here", "n1")


def test_a_missing_root_or_own_account_is_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(GpupoolError, match="useradd --system --no-create-home"):
        service_account("gp-nobody-here")
    with pytest.raises(GpupoolError, match="jobs never run as root"):
        service_account("root")
    entry = _nobody()
    monkeypatch.setattr(os, "geteuid", lambda: entry.pw_uid)
    with pytest.raises(GpupoolError, match="the agent's own account, which holds its token"):
        service_account("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: entry.pw_uid + 1)
    with pytest.raises(GpupoolError, match="--run-as nobody starts jobs as another Unix account"):
        check_mode("nobody", [])


def test_a_token_file_a_job_could_read_is_refused(tmp_path: Path) -> None:
    entry = _nobody()
    token = tmp_path / "agent-token"
    token.write_text("secret")
    token.chmod(0o640)
    with pytest.raises(GpupoolError, match=f"`chmod 600 {token}`"):
        check_token_file("nobody", token)
    check_token_file(AGENT, token)  # the agent's own jobs could read it anyway: not checked
    token.chmod(0o600)
    check_token_file("nobody", token)
    if os.geteuid() == 0:
        os.chown(token, entry.pw_uid, -1)
        with pytest.raises(GpupoolError, match=f"`chown root {token}`"):
            check_token_file("nobody", token)


def test_the_state_folder_lets_jobs_pass_but_keeps_the_records_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    state = home / "agent" / "n1"
    shared = tmp_path / "shared-checkpoints"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    protect_state("nobody", state, [state / "work", state / "checkpoints", shared], below=home)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(state) == mode(home / "agent") == 0o711
    assert mode(state / "work") == mode(state / "checkpoints") == 0o711
    assert mode(state / "jobs") == mode(state / "done") == 0o700
    assert mode(shared) == 0o755  # the operator's folder: left alone


@pytest.mark.skipif(os.geteuid() != 0, reason="--run-as ACCOUNT needs root")
def test_gpupool_up_refuses_a_home_its_jobs_could_not_reach(tmp_path: Path) -> None:
    _nobody()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    args = ["up", "--home", str(closed / "home"), "--run-as", "nobody", "--port", "9"]
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{closed} does not let others pass; `chmod o+x {closed}`" in done.stderr
    assert not (closed / "home").exists()  # refused before anything was made
