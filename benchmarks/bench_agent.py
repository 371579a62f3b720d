"""Node agent cost and launch latency, against a real server.

Starts ``gpupool server`` (SQLite, in a temporary ``$GPUPOOL_HOME``) and one ``gpupool agent``
with 8 simulated A100s, submits 20 fractional jobs (``sleep``) and, once all run, measures:

- the agent process's CPU (share of one core, from ``/proc/<pid>/stat`` user+system time over a
  window) and resident memory, at the server's heartbeat interval; the 20 per-job supervisors are
  reported apart (they are separate processes, ~one Python interpreter each);
- launch latency per job (20 launched in one burst, then ``--singles`` jobs one at a time at a
  random phase against the heartbeat): from the assignment (the job's CONFIGURING event on the
  server) to the job's process start (``started_at`` written by its supervisor), and the
  agent's own part of it, from receiving the assignment (its job folder being written) to the
  process start.

Usage::

    .venv/bin/python benchmarks/bench_agent.py                 # default heartbeat (5 s)
    .venv/bin/python benchmarks/bench_agent.py --heartbeat 0.5 --window 20 --runs 3 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

PY = sys.executable
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heartbeat", type=float, default=5.0, help="server heartbeat, s")
    parser.add_argument("--gpus", default="8xA100-80GB")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--window", type=float, default=30.0, help="CPU window, s")
    parser.add_argument("--runs", type=int, default=3, help="CPU windows (median reported)")
    parser.add_argument("--singles", type=int, default=5, help="jobs launched one at a time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    home = root / "home"
    env = {**os.environ, "GPUPOOL_HOME": str(home)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    log = open(root / "server.log", "ab")  # noqa: SIM115
    procs.append(
        subprocess.Popen(
            [
                PY,
                "-m",
                "gpupool.cli",
                "server",
                "--home",
                str(home),
                "--port",
                str(port),
                "--heartbeat",
                str(args.heartbeat),
            ],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    )
    try:
        wait(lambda: _ok(f"{url}/readyz"), 60, "the server")
        token = (home / "admin-token").read_text().strip()
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        http.post("/v1/users", json={"name": "bench-agent", "role": "agent"}).raise_for_status()
        r = http.post("/v1/tokens", json={"user": "bench-agent"})
        r.raise_for_status()
        (root / "agent-token").write_text(r.json()["secret"])
        state = root / "agent"
        alog = open(root / "agent.log", "ab")  # noqa: SIM115
        agent = subprocess.Popen(
            [
                PY,
                "-m",
                "gpupool.cli",
                "agent",
                "--server",
                url,
                "--token-file",
                str(root / "agent-token"),
                "--simulate",
                args.gpus,
                "--node",
                "bench",
                "--state-dir",
                str(state),
                "--address",
                "127.0.0.1",
            ],
            env=env,
            stdout=alog,
            stderr=alog,
            start_new_session=True,
        )
        procs.append(agent)
        wait(lambda: http.get("/v1/nodes/bench").status_code == 200, 60, "the agent")
        ids = []
        for i in range(args.jobs):
            body = {
                "spec": {
                    "name": f"bench{i}",
                    "command": ["sleep", "3600"],
                    "resources": {"gpus": "0.25", "gpu_memory": "8GiB", "cpus": "50m"},
                }
            }
            r = http.post("/v1/jobs", json=body)
            r.raise_for_status()
            ids.append(r.json()["job"]["id"])

        def all_running() -> bool:
            states = [http.get(f"/v1/jobs/{j}").json()["state"] for j in ids]
            return all(s == "RUNNING" for s in states)

        wait(all_running, 120 + 4 * args.heartbeat, "all jobs running")
        time.sleep(args.heartbeat)  # settle: one more heartbeat

        # -- latency: the 20 launched together, then single jobs one after another
        def latency(job_id: str) -> tuple[float, float]:
            events = http.get(f"/v1/jobs/{job_id}/events").json()
            assigned = next(e["time"] for e in events if e["target"] == "CONFIGURING")
            folder = next(
                p
                for p in (state / "jobs").iterdir()
                if json.loads((p / "assignment.json").read_text())["assignment"]["job_id"] == job_id
            )
            started = json.loads((folder / "state.json").read_text())["started_at"]
            return started - assigned, started - (folder / "launch.json").stat().st_mtime

        burst = [latency(j) for j in ids]
        single = []
        rng = random.Random(7)
        for i in range(args.singles):
            body = {
                "spec": {
                    "name": f"single{i}",
                    "command": ["sleep", "3600"],
                    "resources": {"gpus": "0.1", "gpu_memory": "1GiB", "cpus": "50m"},
                }
            }
            r = http.post("/v1/jobs", json=body)
            r.raise_for_status()
            job_id = r.json()["job"]["id"]
            wait(
                lambda j=job_id: http.get(f"/v1/jobs/{j}").json()["state"] == "RUNNING",
                60 + 4 * args.heartbeat,
                "a single job running",
            )
            wait(lambda j=job_id: _started(state, j), 30, "its start time")
            single.append(latency(job_id))
            time.sleep(rng.uniform(0, args.heartbeat))  # a random phase against heartbeats

        # -- CPU and memory
        burst_ids = set(ids)
        supervisors = [
            json.loads((p.parent / "state.json").read_text())["supervisor_pid"]
            for p in (state / "jobs").glob("*/assignment.json")
            if json.loads(p.read_text())["assignment"]["job_id"] in burst_ids
        ]
        runs = []
        for _ in range(args.runs):
            c0, t0 = cpu_seconds(agent.pid), time.monotonic()
            s0 = sum(cpu_seconds(p) for p in supervisors)
            time.sleep(args.window)
            dt = time.monotonic() - t0
            runs.append(
                {
                    "agent_cpu_pct": 100 * (cpu_seconds(agent.pid) - c0) / dt,
                    "supervisors_cpu_pct": 100
                    * (sum(cpu_seconds(p) for p in supervisors) - s0)
                    / dt,
                    "agent_rss_mib": rss_mib(agent.pid),
                }
            )
        result = {
            "gpus": args.gpus,
            "jobs_running": len(ids),
            "heartbeat_s": args.heartbeat,
            "window_s": args.window,
            "agent_cpu_pct_median": statistics.median(r["agent_cpu_pct"] for r in runs),
            "agent_rss_mib_median": statistics.median(r["agent_rss_mib"] for r in runs),
            "supervisors_cpu_pct_median": statistics.median(r["supervisors_cpu_pct"] for r in runs),
            "supervisor_rss_mib_each": statistics.median(rss_mib(p) for p in supervisors),
            "burst_assign_to_start_s_median": statistics.median(b[0] for b in burst),
            "burst_agent_receipt_to_start_s_median": statistics.median(b[1] for b in burst),
            "burst_agent_receipt_to_start_s_max": max(b[1] for b in burst),
            "single_assign_to_start_s_median": statistics.median(x[0] for x in single),
            "single_assign_to_start_s_max": max(x[0] for x in single),
            "single_agent_receipt_to_start_s_median": statistics.median(x[1] for x in single),
            "single_agent_receipt_to_start_s_max": max(x[1] for x in single),
            "runs": runs,
        }
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        for st in (root / "agent" / "jobs").glob("*/state.json"):
            data = json.loads(st.read_text())
            for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                if data.get(key):
                    with contextlib.suppress(OSError):
                        kill(int(data[key]), signal.SIGKILL)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"agent with {result['gpus']} simulated, {result['jobs_running']} running jobs, "
        f"heartbeat {result['heartbeat_s']} s, {args.runs} windows of {args.window:.0f} s"
    )
    print("| measure | value | target |\n|---|---|---|")
    print(f"| agent CPU (median) | {result['agent_cpu_pct_median']:.2f} % of one core | <= 3 % |")
    print(f"| agent RSS (median) | {result['agent_rss_mib_median']:.1f} MiB | <= 150 MiB |")
    print(
        f"| 20 supervisors CPU (median, total) | {result['supervisors_cpu_pct_median']:.2f} % | |"
    )
    print(f"| one supervisor RSS (median) | {result['supervisor_rss_mib_each']:.1f} MiB | |")
    r = result
    n = r["jobs_running"]
    rows = [
        (
            "single job: assignment -> process start (median / max)",
            f"{r['single_assign_to_start_s_median']:.2f} / "
            f"{r['single_assign_to_start_s_max']:.2f} s",
            "< 1 s",
        ),
        (
            "single job: agent receipt -> process start (median / max)",
            f"{r['single_agent_receipt_to_start_s_median']:.3f} / "
            f"{r['single_agent_receipt_to_start_s_max']:.3f} s",
            "",
        ),
        (
            f"burst of {n}: assignment -> process start (median)",
            f"{r['burst_assign_to_start_s_median']:.2f} s",
            "",
        ),
        (
            f"burst of {n}: agent receipt -> process start (median / max)",
            f"{r['burst_agent_receipt_to_start_s_median']:.3f} / "
            f"{r['burst_agent_receipt_to_start_s_max']:.3f} s",
            "",
        ),
    ]
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")


def _started(state: Path, job_id: str) -> bool:
    for p in (state / "jobs").glob("*/assignment.json"):
        if json.loads(p.read_text())["assignment"]["job_id"] == job_id:
            data = json.loads((p.parent / "state.json").read_text() or "{}")
            return bool(data.get("started_at"))
    return False


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
