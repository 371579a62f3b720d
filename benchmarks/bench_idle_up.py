"""CPU an idle pool burns: ``gpupool up`` with nothing to do, measured from ``/proc``.

    python benchmarks/bench_idle_up.py                   # settle 20 s, measure 60 s
    python benchmarks/bench_idle_up.py --jobs 40 --simulate 20xA100-80GB   # 40 jobs running

Starts ``gpupool up --simulate 2xA100-80GB`` (server, SQLite store, scheduling loop and a
local agent, one process) in a temporary home on a free port, optionally submits ``--jobs``
jobs that sleep for an hour, waits ``--settle`` seconds, then reads the process's user +
system CPU (with its children: job supervisors) over ``--measure`` seconds and prints it as
CPU-s per minute, the daemon's resident memory (the ``gpupool up`` process alone, not its jobs)
and the load average. The issue's target: under 0.1 CPU-s a minute.

``--threads`` also prints the daemon's CPU per thread over the window (``/proc/PID/task``),
named by their Python names (``py-spy dump``, when it is on the ``PATH``; worker threads that
came and went within the window are counted in the total only).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from tests.e2e.pool import kill_left_jobs

TICK = os.sysconf("SC_CLK_TCK")
# Jobs run as the daemon's account (as in the tests, tests/conftest.py): the temporary home is
# private, so jobs run as other accounts could not reach their folders.
os.environ.setdefault("GPUPOOL_RUN_AS", "agent")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (live ones)."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICK
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return total


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid``, by its thread id."""
    cpu: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICK
    return cpu


def thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from ``py-spy dump`` (empty without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        out = subprocess.run(
            [spy, "dump", "--pid", str(pid)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names: dict[int, str] = {}
    for line in out.splitlines():
        head, _, name = line.partition(": ")
        if line.startswith("Thread ") and head.split()[1].isdigit():
            names[int(head.split()[1])] = name.strip().strip('"')
    return names


def print_threads(pid: int, before: dict[int, float], after: dict[int, float]) -> None:
    """The CPU of each thread over the window, summed by name, largest first."""
    names = thread_names(pid)
    by_name: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid, f"thread {tid}")
        by_name[name] = by_name.get(name, 0.0) + cpu - before.get(tid, 0.0)
    for name, cpu in sorted(by_name.items(), key=lambda item: -item[1]):
        print(f"  {name}: {cpu:.2f} CPU-s")


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` alone (the daemon, not its jobs), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _count(response: httpx.Response) -> int:
    body = response.json() if response.status_code == 200 else []
    items = body.get("jobs", []) if isinstance(body, dict) else body
    return len(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--measure", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--simulate", default="2xA100-80GB", help="the GPUs (jobs take half one)")
    parser.add_argument("--threads", action="store_true", help="print the CPU per thread too")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        home = Path(tmp) / "home"
        log = open(Path(tmp) / "up.log", "ab")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli", "up", "--home", str(home), "--port", str(port),
             "--simulate", args.simulate],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"gpupool up did not start: {(Path(tmp) / 'up.log').read_text()}"
                    )
                time.sleep(0.2)
            token = (home / "admin-token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            for i in range(args.jobs):
                spec = {"name": f"idle-{i}", "command": ["sleep", "3600"],
                        "resources": {"gpus": "0.5"}}  # fmt: skip
                httpx.post(f"{url}/v1/jobs", json={"spec": spec}, headers=headers, timeout=30)
            time.sleep(args.settle)
            threads0 = thread_cpu(proc.pid)
            cpu0, t0 = tree_cpu(proc.pid), time.monotonic()
            time.sleep(args.measure)
            cpu1, t1 = tree_cpu(proc.pid), time.monotonic()
            threads1 = thread_cpu(proc.pid)
            if args.threads:
                print(f"per thread over {t1 - t0:.0f} s:")
                print_threads(proc.pid, threads0, threads1)
            rss = rss_mib(proc.pid)
            running = httpx.get(f"{url}/v1/jobs?state=RUNNING", headers=headers, timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
            # gpupool up leaves its jobs running (for the next start to adopt): end them
            kill_left_jobs(home / "agent", "*/jobs/*/state.json")
    per_minute = 60 * (cpu1 - cpu0) / (t1 - t0)
    print(f"idle gpupool up, {args.jobs} job(s): {per_minute:.3f} CPU-s per minute")
    print(f"daemon (the gpupool up process) RSS: {rss:.0f} MiB; {_count(running)} job(s) running")
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
