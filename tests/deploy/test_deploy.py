"""The deployment files under ``deploy/`` work as shipped.

The systemd units pass ``systemd-analyze verify``; their ``ExecStart`` lines, with the sample
environment files, start a real server and a real agent here (paths moved under a temporary
folder, simulated GPUs since this machine has none) that run a job, and stopping the agent the
way ``KillMode=process`` does leaves a running job alive. Every metric the Prometheus alert
rules use is one that a live server exports.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.pool import wait_for
from tests.ports import free_port
from tests.readiness import answers_ready, wait_ready

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SYSTEMD = DEPLOY / "systemd"
GPUPOOL = "/opt/gpupool/bin/gpupool"


def _unit(name: str) -> dict[str, list[str]]:
    """``Key`` -> values of a unit file (systemd allows repeated keys)."""
    values: dict[str, list[str]] = {}
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def _env_file(name: str) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (SYSTEMD / name).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    return {k.strip(): v.strip() for k, v in pairs}


def _argv(exec_start: str, env: dict[str, str], moves: dict[str, str]) -> list[str]:
    """The unit's command line as systemd would run it, with paths moved for this test."""
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], exec_start)
    for old, new in moves.items():
        line = line.replace(old, new)
    argv = shlex.split(line)
    assert argv[0] == GPUPOOL, "units run the installed gpupool script"
    return [sys.executable, "-m", "gpupool.cli", *argv[1:]]


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    script = Path(sys.executable).with_name("gpupool")
    for unit in ("gpupool-server.service", "gpupool-agent.service"):
        text = (SYSTEMD / unit).read_text().replace(GPUPOOL, str(script))
        (tmp_path / unit).write_text(text)
    done = subprocess.run(
        [analyze, "verify", "--man=no", *(str(p) for p in sorted(tmp_path.glob("*.service")))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_agent_unit_kills_only_the_agent_process_and_always_restarts_it() -> None:
    agent = _unit("gpupool-agent.service")
    assert agent["KillMode"] == ["process"]
    assert agent["Restart"] == ["always"]


def test_the_agent_unit_delegates_its_cgroup_so_each_replica_gets_one() -> None:
    assert _unit("gpupool-agent.service")["Delegate"] == ["yes"]


class Deployed:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.http: httpx.Client | None = None

    def start(self, name: str, unit: str, env: dict[str, str], *extra: str) -> None:
        moves = {"/var/lib/gpupool": str(self.root / "var"), "/etc/gpupool": str(self.root)}
        argv = _argv(_unit(unit)["ExecStart"][0], env, moves) + list(extra)
        proc_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        proc_env["GPUPOOL_HOME"] = str(self.root / "var")
        # The unit runs the agent as User=gpupool, whose --run-as auto is the agent's own
        # account; this test runs it as root, where auto would switch accounts.
        proc_env["GPUPOOL_RUN_AS"] = "agent"
        proc_env.update(env)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen(
            argv, env=proc_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def api(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        r = self.http.request(method, path, json=body)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    d = Deployed(tmp_path_factory.mktemp("deploy"))
    server_env = _env_file("server.env")
    server_env.update(
        GPUPOOL_DATABASE_URL=f"sqlite:///{d.root / 'var' / 'gpupool.db'}",
        GPUPOOL_LISTEN="127.0.0.1",
        GPUPOOL_PORT=str(d.port),
    )
    (d.root / "var").mkdir()
    d.start("server", "gpupool-server.service", server_env)

    try:
        wait_ready(
            lambda: answers_ready(d.url),
            what="the server from gpupool-server.service",
            proc=d.procs["server"],
            log=d.root / "server.log",
        )
        admin = (d.root / "var" / "admin-token").read_text().strip()
        d.http = httpx.Client(
            base_url=d.url, headers={"Authorization": f"Bearer {admin}"}, timeout=20
        )
        d.api("POST", "/v1/users", {"name": "node-agent", "role": "agent"})
        secret = d.api("POST", "/v1/tokens", {"user": "node-agent"})["secret"]
        token = d.root / "agent-token"
        token.write_text(secret + "\n")
        token.chmod(0o600)
        agent_env = _env_file("agent.env")
        agent_env["GPUPOOL_SERVER"] = d.url
        d.start("agent", "gpupool-agent.service", agent_env, "--simulate", "2xT4", "--node", "n1")
        wait_ready(
            lambda: d.api("GET", "/v1/nodes"),
            what="the agent from gpupool-agent.service",
            proc=d.procs["agent"],
            log=d.root / "agent.log",
        )
        yield d
    finally:
        for proc in d.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        subprocess.run(["pkill", "-9", "-f", str(d.root)], check=False)
        if d.http is not None:
            d.http.close()


def _wait_state(d: Deployed, job_id: str, *states: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        job: dict[str, Any] = d.api("GET", f"/v1/jobs/{job_id}")
        return job if job["state"] in states else None

    return wait_for(probe, 90, f"job {job_id} in {states}")


def test_the_units_command_lines_start_a_pool_that_runs_a_job(deployed: Deployed) -> None:
    d = deployed
    spec = {"name": "hello", "command": ["sh", "-c", "exit 3"], "resources": {"gpus": "0.5"}}
    job = d.api("POST", "/v1/jobs", {"spec": spec})["job"]["id"]
    done = _wait_state(d, job, "FAILED", "COMPLETED")
    assert (done["state"], done["exit_code"]) == ("FAILED", 3), d.log("agent")
    assert [n["name"] for n in d.api("GET", "/v1/nodes")] == ["n1"]


def test_stopping_the_agent_like_killmode_process_leaves_its_job_running(
    deployed: Deployed,
) -> None:
    d = deployed
    marker = d.root / "still-running"
    program = (
        "import sys, time, pathlib\n"
        "for i in range(600):\n"
        "    pathlib.Path(sys.argv[1]).write_text(str(i)); time.sleep(0.1)\n"
    )
    command = [sys.executable, "-c", program, str(marker)]
    spec = {"name": "long", "command": command, "resources": {"gpus": "0.5"}}
    job = d.api("POST", "/v1/jobs", {"spec": spec})["job"]["id"]
    _wait_state(d, job, "RUNNING")
    wait_for(marker.exists, 30, "the job to write its marker")
    agent = d.procs["agent"]
    agent.send_signal(signal.SIGTERM)  # what `systemctl stop` does with KillMode=process
    assert agent.wait(timeout=30) is not None
    seen = marker.read_text()
    wait_for(lambda: marker.read_text() != seen or None, 10, "the job to go on without its agent")
    agent_env = _env_file("agent.env")
    agent_env["GPUPOOL_SERVER"] = d.url
    d.start("agent", "gpupool-agent.service", agent_env, "--simulate", "2xT4", "--node", "n1")
    assert _wait_state(d, job, "RUNNING")["restart_count"] == 0  # re-adopted, not relaunched
    d.api("POST", f"/v1/jobs/{job}/cancel")
    assert _wait_state(d, job, "CANCELLED")["state"] == "CANCELLED"


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\bgpupool_[a-z_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_every_metric_the_alert_rules_use_is_exported(deployed: Deployed) -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "gpupool-alerts.yml").read_text())
    used: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["annotations"]["summary"], rule["alert"]
            used |= _metric_names(rule["expr"])
    exported = set(
        re.findall(r"^# TYPE (gpupool_\w+) ", httpx.get(f"{deployed.url}/metrics").text, re.M)
    )
    assert used, "the rules use no gpupool metric: the name pattern is wrong"
    assert used - exported == set()
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert scrape["rule_files"] == ["gpupool-alerts.yml"]
    assert scrape["scrape_configs"][0]["metrics_path"] == "/metrics"
