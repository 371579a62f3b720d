"""End to end: a job that goes looking for credentials finds none.

A member's job is a program like any other, and on a pool with more than one user it must not
become an admin: it must not read the admin token, an agent's token (which downloads every
tenant's uploads), the store (uploads, job environments) or another job's records. The job
here (``THIEF``) tries every place it can name: the server's home and every file gpupool keeps
there, the agent's token file and state folder, the SQLite file and its ``-wal``/``-shm``,
``/proc/<pid>/environ`` and ``cmdline`` of every process it can see (the server's and the
agent's among them), and its own environment (``GPUPOOL_TOKEN`` is set in the agent's). It
prints what it could read to its log, which the test reads back through the API, as the job's
owner would, and checks that no secret is in it and no credential path was readable.

Jobs run as another Unix account (``--run-as ACCOUNT`` or ``--run-as submitter``), which needs
root: the test creates a throwaway account with ``useradd`` and removes it after; it skips with
the reason where it is not root or has no ``useradd``. The job runs the system Python, which
any account may run (the test's own interpreter may live where the account cannot go).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.pool import wait_for
from tests.ports import free_port

SYSTEM_PYTHON = "/usr/bin/python3"

#: argv[1]: JSON {"files": [...], "folders": [...]}. Prints its report as JSON lines, then
#: ``END`` (so the test knows the whole log has reached the server).
THIEF = r"""
import glob, json, os, sys
named = json.loads(sys.argv[1])
def say(**kw):
    print(json.dumps(kw), flush=True)
def grab(path):
    try:
        with open(path, "rb") as f:
            return {"read": True, "text": f.read(1 << 16).decode("latin-1")}
    except OSError as exc:
        return {"read": False, "error": type(exc).__name__}
say(kind="uid", uid=os.getuid())
say(kind="env", env=dict(os.environ))
tried = set()
for path in named["files"]:
    say(kind="file", path=path, **grab(path))
    tried.add(path)
for path in named["folders"]:
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        say(kind="folder", path=path, listed=False, error=type(exc).__name__)
        continue
    say(kind="folder", path=path, listed=True, names=names)
    for name in names:  # whatever a listable folder holds is tried too
        full = os.path.join(path, name)
        if os.path.isfile(full) and full not in tried:
            say(kind="file", path=full, **grab(full))
for path in sorted(glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline")):
    got = grab(path)
    if got["read"] and got["text"]:
        say(kind="proc", path=path, text=got["text"])
print("END", flush=True)
"""


def _report(log: str) -> dict[str, Any]:
    """The thief's JSON lines as one report: uid, env, files, folders, proc."""
    report: dict[str, Any] = {"files": {}, "folders": {}, "proc": {}}
    for line in log.splitlines():
        if line == "END":
            break
        item = json.loads(line)
        kind = item.pop("kind")
        if kind in ("uid", "env"):
            report[kind] = item[kind]
        elif kind == "proc":
            report["proc"][item["path"]] = item["text"]
        else:
            report[kind + "s"][item.pop("path")] = item
    return report


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="jobs run as another Unix account only when the agent is root"
)


@pytest.fixture
def job_account() -> Iterator[str]:
    """A throwaway unprivileged Unix account for jobs, removed afterwards."""
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("no useradd/userdel on this machine to make an account for jobs")
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no {SYSTEM_PYTHON} for the job to run")
    name = f"gpjob-{secrets.token_hex(3)}"
    nologin = shutil.which("nologin") or "/bin/false"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", nologin, name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A folder others may pass through (pytest's own tmp folders are 0700, so no job running
    as another account could reach a folder below them)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-creds-", dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _launch(args: list[str], log: Path, env: dict[str, str]) -> Proc:
    handle = open(log, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Proc(proc, log)


def _kill_jobs(state_dir: Path) -> None:
    for state in state_dir.glob("jobs/*/state.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(state.read_text())
            for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                if data.get(key):
                    with contextlib.suppress(OSError):
                        kill(int(data[key]), signal.SIGKILL)


def _steal(
    http: httpx.Client, named: dict[str, list[str]], *, as_token: str | None = None
) -> dict[str, Any]:
    """Run the thief job (as the holder of ``as_token``, else the client's caller), wait for
    it, and return its report, read through the logs API."""
    body = {
        "spec": {
            "name": "thief",
            "command": [SYSTEM_PYTHON, "-c", THIEF, json.dumps(named)],
            "resources": {"gpus": "0.5"},
        }
    }
    headers = {"Authorization": f"Bearer {as_token}"} if as_token else {}
    r = http.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    job_id = r.json()["job"]["id"]

    def ended() -> dict[str, Any] | None:
        job = http.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in ("COMPLETED", "FAILED", "BOOT_FAIL", "CANCELLED") else None

    job = wait_for(ended, 90, "the thief job to end")
    assert job["state"] == "COMPLETED", job
    text = wait_for(
        lambda: (
            (t := http.get(f"/v1/jobs/{job_id}/logs", headers=headers).text).endswith("END\n") and t
        ),
        60,
        "the thief's whole log",
    )
    return _report(text)


def _assert_found_nothing(
    report: dict[str, Any], account: str, secret_values: list[str], credential_files: list[str]
) -> None:
    for path in credential_files:
        assert not report["files"][path]["read"], f"the job read {path}"
    for path, seen in report["folders"].items():
        assert not seen["listed"], f"the job listed {path}: {seen.get('names')}"
    assert "GPUPOOL_TOKEN" not in report["env"]
    everything = json.dumps(report)
    for value in secret_values:
        assert value not in everything, "a secret reached the job"
    uid = subprocess.run(["id", "-u", account], check=True, capture_output=True, text=True)
    assert report["uid"] == int(uid.stdout) != 0


def _tokens(http: httpx.Client, user: str, role: str, tenant: str | None = None) -> str:
    r = http.post("/v1/users", json={"name": user, "role": role, "tenant": tenant})
    assert r.status_code in (200, 201), r.text
    r = http.post("/v1/tokens", json={"user": user, "name": "test"})
    assert r.status_code == 201, r.text
    return str(r.json()["secret"])


@needs_root
@pytest.mark.parametrize("mode", ["account", "submitter"])
def test_a_job_on_gpupool_up_with_run_as_reads_no_credential(
    open_root: Path, job_account: str, mode: str
) -> None:
    home = open_root / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_as = job_account if mode == "account" else "submitter"
    up = _launch(
        ["up", "--port", str(port), "--simulate", "2xA100-80GB", "--run-as", run_as],
        open_root / "up.log",
        {"GPUPOOL_HOME": str(home), "GPUPOOL_TOKEN": "placeholder"},
    )
    try:
        wait_for(lambda: _ready(url), 60, f"gpupool up to answer:\n{up.tail()}")
        admin = (home / "admin-token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=20)
        wait_for(lambda: http.get("/v1/nodes").json(), 60, f"the local agent:\n{up.tail()}")
        # The submitter's path: a member named like the Unix account submits the job.
        member = _tokens(http, job_account, "member", "default")
        agent_token = (home / "agent-token").read_text().strip()
        state = next((home / "agent").iterdir())
        pid = str(up.proc.pid)
        files = [
            str(home / name)
            for name in (
                "admin-token",
                "agent-token",
                "gpupool.db",
                "gpupool.db-wal",
                "gpupool.db-shm",
                "server-url",
            )
        ] + [f"/proc/{pid}/environ"]
        folders = [str(home), str(home / "logs"), str(home / "agent"), str(state)]
        folders += [str(state / "jobs"), str(state / "done"), str(state / "work")]
        report = _steal(http, {"files": files, "folders": folders}, as_token=member)
        # The server's command line is readable (as every process's is) but holds no secret.
        assert f"/proc/{pid}/cmdline" in report["proc"]
        _assert_found_nothing(report, job_account, [admin, agent_token], files)
        said = (
            f"Unix account {job_account}"
            if mode == "account"
            else "their submitters' Unix accounts"
        )
        assert f"jobs run as {said}" in up.tail()
        http.close()
    finally:
        up.stop()
        for state_dir in (home / "agent").glob("*"):
            _kill_jobs(state_dir)


@needs_root
def test_a_job_on_a_cluster_node_reads_neither_the_agent_token_nor_the_store(
    open_root: Path, job_account: str
) -> None:
    home = open_root / "server-home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _launch(
        ["server", "--home", str(home), "--port", str(port), "--heartbeat", "0.5"],
        open_root / "server.log",
        {},
    )
    state = open_root / "node-state"
    agent: Proc | None = None
    try:
        wait_for(lambda: _ready(url), 60, f"the server to answer:\n{server.tail()}")
        admin = (home / "admin-token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=20)
        agent_token = _tokens(http, "node-agent", "agent")
        etc = open_root / "etc"
        etc.mkdir(mode=0o755)
        token_file = etc / "agent-token"
        token_file.write_text(agent_token)
        token_file.chmod(0o600)
        agent = _launch(
            [
                "agent",
                "--server",
                url,
                "--token-file",
                str(token_file),
                "--simulate",
                "2xA100-80GB",
                "--node",
                "n1",
                "--state-dir",
                str(state),
                "--run-as",
                job_account,
            ],
            open_root / "agent.log",
            # An operator who exported the token: it must still not reach a job.
            {"GPUPOOL_TOKEN": agent_token},
        )
        wait_for(
            lambda: http.get("/v1/nodes/n1").status_code == 200,
            60,
            f"the agent to register:\n{agent.tail()}",
        )
        pid = str(agent.proc.pid)
        files = [str(token_file), f"/proc/{pid}/environ", str(home / "admin-token")]
        files += [str(home / n) for n in ("gpupool.db", "gpupool.db-wal", "gpupool.db-shm")]
        folders = [str(state), str(state / "jobs"), str(state / "done"), str(state / "work")]
        folders.append(str(home))
        report = _steal(http, {"files": files, "folders": folders})
        assert f"/proc/{pid}/cmdline" in report["proc"]  # readable, and holds no secret
        _assert_found_nothing(report, job_account, [admin, agent_token], files)
        assert f"jobs run as Unix account {job_account}" in agent.tail()
        http.close()
    finally:
        if agent is not None:
            agent.stop()
        _kill_jobs(state)
        server.stop()


@needs_root
def test_an_agent_whose_token_file_others_can_read_refuses_to_start(
    open_root: Path, job_account: str
) -> None:
    token_file = open_root / "agent-token"
    token_file.write_text("not-used")
    token_file.chmod(0o644)
    args = ["agent", "--server", "http://127.0.0.1:9", "--token-file", str(token_file)]
    args += ["--simulate", "1xA100-80GB", "--state-dir", str(open_root / "s")]
    args += ["--run-as", job_account]
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"`chmod 600 {token_file}`" in done.stderr


def test_gpupool_up_says_plainly_that_jobs_run_as_its_owner(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    up = _launch(
        ["up", "--port", str(port), "--simulate", "1xA100-80GB"],
        tmp_path / "up.log",
        {"GPUPOOL_HOME": str(home)},
    )
    try:
        wait_for(lambda: _ready(url), 60, f"gpupool up to answer:\n{up.tail()}")
        me = pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:  # the suite's pools say --run-as agent (tests/conftest.py)
            assert "jobs run as root (--run-as agent): any job can read the admin " in up.tail()
        else:
            said = f"this is your own pool: jobs run as {me}, this process's own account: any"
            assert said in up.tail()
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for name in ("admin-token", "gpupool.db", "server-url"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    finally:
        up.stop()
