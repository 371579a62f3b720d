"""End to end: a hostile job on a pool started as root with the defaults (issue 24 items 1, 2).

Two tenants share a node. The victim (tenant ``blue``) runs with a secret in its environment
and an uploaded folder holding a secret file, and writes one more secret file where it runs.
The thief (tenant ``red``) is then given everything an attacker could learn (the victim's pid
and folders, the server's home, the agent's state folder and token file) and tries: reading
every credential file (admin token, agent token, agent id, the store and its ``-wal``/``-shm``),
listing the agent's folders, reading the victim's ``/proc/PID/environ``, files and upload
copy, and signalling the victim (signal 0: the permission check alone, so a thief that may
signal kills nothing). It prints what it could do to its log, which the test reads through
the API as the thief's owner would.

Both pools are started as root without ``--run-as`` (and without ``GPUPOOL_RUN_AS``, which the
suite sets for its other pools): ``gpupool up`` and a cluster's ``gpupool server`` +
``gpupool agent``. Neither gpupool user has a Unix account, so each replica runs as a
transient UID of its own; the test checks that the two UIDs differ, that neither is root, and
that the victim's UID is released (no process left, lease gone) once its job has ended.

The shim's region (``GPUPOOL_CUDA_REGION``) exists only on a node with a real driver; it is
the shim's issue (item 9 there) and is not tried here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.agent.dynuid import FIRST_UID, LAST_UID, processes_of, registry_path
from gpupool.client.pack import pack_folder
from tests.e2e.pool import wait_for
from tests.e2e.test_job_credentials import (
    SYSTEM_PYTHON,
    Proc,
    _kill_jobs,
    _launch,
    _ready,
    needs_root,
    open_root,
)
from tests.ports import free_port

__all__ = ["open_root"]  # the fixture, used by name

VICTIM = r"""
import os, sys, time
open("secret-written.txt", "w").write(os.environ["VICTIM_SECRET"] + "-file")
print("READY", os.getpid(), os.getcwd(), os.getuid(), flush=True)
deadline = time.time() + 300
while time.time() < deadline and not os.path.exists("stop"):
    time.sleep(0.2)
"""

#: argv[1]: JSON {"files": [...], "folders": [...], "pid": victim pid}.
THIEF = r"""
import json, os, sys
named = json.loads(sys.argv[1])
report = {"uid": os.getuid(), "env": dict(os.environ), "files": {}, "folders": {}}
for path in named["files"]:
    try:
        with open(path, "rb") as f:
            report["files"][path] = {"read": True, "text": f.read(1 << 16).decode("latin-1")}
    except OSError as exc:
        report["files"][path] = {"read": False, "error": type(exc).__name__}
for path in named["folders"]:
    try:
        report["folders"][path] = {"listed": True, "names": sorted(os.listdir(path))}
    except OSError as exc:
        report["folders"][path] = {"listed": False, "error": type(exc).__name__}
pid = named["pid"]
try:
    os.kill(pid, 0)
    report["signal"] = "allowed"
except OSError as exc:
    report["signal"] = type(exc).__name__
print(json.dumps(report), flush=True)
print("END", flush=True)
"""


@dataclass
class Target:
    """A started pool: its admin client, the credential files and folders a thief tries, and
    the process that runs its agent."""

    http: httpx.Client
    credentials: list[str]
    folders: list[str]
    proc: Proc


def _upload(http: httpx.Client, token: str, secret: str) -> str:
    """Upload a folder holding one secret file, as `gpupool submit --workdir` does."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "secret-upload.txt").write_text(f"{secret}-upload")
        archive = pack_folder(Path(folder))
    r = http.post(
        "/v1/uploads",
        content=archive,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["upload_id"])


def _member(http: httpx.Client, tenant: str) -> str:
    assert http.put(f"/v1/tenants/{tenant}", json={"fair_share": 1.0}).status_code in (200, 201)
    name = f"{tenant}-{secrets.token_hex(3)}"  # no Unix account of that name
    r = http.post("/v1/users", json={"name": name, "role": "member", "tenant": tenant})
    assert r.status_code == 201, r.text
    r = http.post("/v1/tokens", json={"user": name, "name": "test"})
    assert r.status_code == 201, r.text
    return str(r.json()["secret"])


def _submit(http: httpx.Client, token: str, body: dict[str, Any]) -> str:
    r = http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    return str(r.json()["job"]["id"])


def _log(http: httpx.Client, token: str, job_id: str) -> str:
    r = http.get(f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {token}"})
    return r.text if r.status_code == 200 else ""


def _attack(http: httpx.Client, credentials: list[str], folders: list[str], agent_uid: int) -> None:
    """Run the victim and the thief on the pool behind ``http`` (admin) and check the thief
    found nothing."""
    victim_token, thief_token = _member(http, "blue"), _member(http, "red")
    secret = secrets.token_hex(16)
    upload = _upload(http, victim_token, secret)
    victim_id = _submit(
        http,
        victim_token,
        {
            "spec": {
                "name": "victim",
                "command": [SYSTEM_PYTHON, "-c", VICTIM],
                "env": {"VICTIM_SECRET": secret},
                "resources": {"gpus": "0.5"},
            },
            "workdir_upload": upload,
        },
    )
    ready = wait_for(
        lambda: next(
            (ln for ln in _log(http, victim_token, victim_id).splitlines() if ln[:5] == "READY"),
            None,
        ),
        90,
        "the victim to run",
    )
    _, pid, cwd, victim_uid = ready.split()
    named = {
        "files": [
            *credentials,
            f"/proc/{pid}/environ",
            os.path.join(cwd, "secret-upload.txt"),
            os.path.join(cwd, "secret-written.txt"),
        ],
        "folders": [*folders, cwd],
        "pid": int(pid),
    }
    thief_id = _submit(
        http,
        thief_token,
        {
            "spec": {
                "name": "thief",
                "command": [SYSTEM_PYTHON, "-c", THIEF, json.dumps(named)],
                "resources": {"gpus": "0.5"},
            }
        },
    )
    text = wait_for(
        lambda: (t := _log(http, thief_token, thief_id)).endswith("END\n") and t,
        90,
        "the thief's report",
    )
    report = json.loads(text.splitlines()[0])
    read = [p for p, seen in report["files"].items() if seen["read"]]
    listed = [p for p, seen in report["folders"].items() if seen["listed"]]
    assert read == [], f"the thief read {read}"
    assert listed == [], f"the thief listed {listed}"
    assert report["signal"] == "PermissionError", "the thief may signal the victim"
    assert secret not in json.dumps(report)
    assert "GPUPOOL_TOKEN" not in report["env"]
    uids = {report["uid"], int(victim_uid)}
    assert len(uids) == 2, "the two tenants' replicas share an account"
    assert all(FIRST_UID <= uid <= LAST_UID for uid in uids), uids  # transient, not root
    assert agent_uid not in uids
    # The victim's end: its transient account is released (no process, no lease).
    r = http.post(
        f"/v1/jobs/{victim_id}/cancel", headers={"Authorization": f"Bearer {victim_token}"}
    )
    assert r.status_code == 200, r.text
    wait_for(
        lambda: not processes_of(int(victim_uid)) and not (registry_path() / victim_uid).exists(),
        90,
        f"transient UID {victim_uid} to be released",
    )


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of an operator who set no ``GPUPOOL_RUN_AS``."""
    monkeypatch.delenv("GPUPOOL_RUN_AS", raising=False)
    return {}


@contextlib.contextmanager
def _gpupool_up(root: Path, env: dict[str, str]) -> Iterator[Target]:
    """A root ``gpupool up`` with the defaults."""
    home, port = root / "home", free_port()
    up = _launch(
        ["up", "--port", str(port), "--simulate", "2xA100-80GB"],
        root / "up.log",
        {"GPUPOOL_HOME": str(home), **env},
    )
    try:
        wait_for(lambda: _ready(f"http://127.0.0.1:{port}"), 60, f"gpupool up:\n{up.tail()}")
        admin = (home / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=20,
        ) as http:
            wait_for(lambda: http.get("/v1/nodes").json(), 60, f"its agent:\n{up.tail()}")
            state = next((home / "agent").iterdir())
            names = ("admin-token", "agent-token", "gpupool.db", "gpupool.db-wal", "server-url")
            files = [str(home / n) for n in names]
            files += [str(state / "agent-id"), f"/proc/{up.proc.pid}/environ"]
            yield Target(http, files, [str(home), *_agent_folders(state)], up)
    finally:
        up.stop()
        for state in (home / "agent").glob("*"):
            _kill_jobs(state)


@contextlib.contextmanager
def _cluster(root: Path, env: dict[str, str]) -> Iterator[Target]:
    """A ``gpupool server`` and a root ``gpupool agent`` with the defaults."""
    home, port, state = root / "server-home", free_port(), root / "node-state"
    url = f"http://127.0.0.1:{port}"
    args = ["server", "--home", str(home), "--port", str(port), "--heartbeat", "0.5"]
    server = _launch(args, root / "server.log", env)
    agent: Proc | None = None
    try:
        wait_for(lambda: _ready(url), 60, f"the server:\n{server.tail()}")
        admin = (home / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=20
        ) as http:
            assert http.post("/v1/users", json={"name": "n1a", "role": "agent"}).status_code == 201
            agent_token = http.post("/v1/tokens", json={"user": "n1a"}).json()["secret"]
            (root / "etc").mkdir(mode=0o755)
            token_file = root / "etc" / "agent-token"
            token_file.write_text(agent_token)
            token_file.chmod(0o600)
            agent = _launch(
                ["agent", "--server", url, "--token-file", str(token_file), "--simulate",
                 "2xA100-80GB", "--node", "n1", "--state-dir", str(state)],
                root / "agent.log",
                {"GPUPOOL_TOKEN": agent_token, **env},  # an operator who exported it
            )  # fmt: skip
            wait_for(lambda: http.get("/v1/nodes/n1").status_code == 200, 60, agent.tail())
            files = [str(token_file), str(state / "agent-id"), str(home / "admin-token")]
            files += [str(home / n) for n in ("gpupool.db", "gpupool.db-wal")]
            files.append(f"/proc/{agent.proc.pid}/environ")
            yield Target(http, files, [str(home), *_agent_folders(state)], agent)
    finally:
        if agent is not None:
            agent.stop()
        _kill_jobs(state)
        server.stop()


def _agent_folders(state: Path) -> list[str]:
    return [str(state), *(str(state / n) for n in ("jobs", "done", "work"))]


@needs_root
@pytest.mark.parametrize("kind", ["gpupool up", "cluster agent"])
def test_a_hostile_job_on_a_default_root_pool_reaches_no_credential_and_no_tenant(
    open_root: Path, plain_env: dict[str, str], kind: str
) -> None:
    start = _gpupool_up if kind == "gpupool up" else _cluster
    with start(open_root, plain_env) as target:
        _attack(target.http, target.credentials, target.folders, agent_uid=0)
        assert "never as root or as this process's account" in target.proc.tail()
