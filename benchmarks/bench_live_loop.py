"""The live scheduling loop with a deep queue, and the drain of many short jobs, against a real
``gpupool server`` process and a real ``gpupool agent`` with simulated GPUs.

Two scenarios (each on a fresh server, agent and store):

``loop``
    4 simulated A100s, 3.5 of them held by four ``sleep`` jobs, then ``--queued`` 1-GPU jobs
    queued behind them (submitted as job arrays; none can start). Measured:

    - **cycle**: the server's own ``gpupool_scheduler_cycle_seconds`` (its ``/metrics``), mean
      over the cycles that ran while nothing else happened (``--cycles`` of them);
    - **urgent**: a 0.1-GPU job of priority class ``high`` submitted behind the queue, from its
      submit to CONFIGURING (placed by a cycle) and to RUNNING (started by the agent), ``--urgent``
      times (each cancelled before the next);
    - **queue**: the wall time of ``gpupool queue`` (the CLI process, all pages), ``--runs`` times.

``drain``
    4 simulated A100s, an array of ``--short`` jobs of ``sleep --sleep`` at 0.1 GPU each (so 40
    fit at once), submitted in one request; measured from the submit to the last job's end:
    the **makespan**, and the most jobs RUNNING at once (from each job's start and end time).
    CPUs: each job asks for ``--cpus`` (default 10m), so the 40 fit on a small machine; the
    simulated node reports this machine's CPUs.

``--database-url`` (a PostgreSQL URL of a server where the user may create databases) makes each
scenario run on a fresh database there, dropped at the end; the default is SQLite in the
scenario's home. ``--src`` runs another checkout's ``src`` (e.g. an extracted older commit) for
the server, agent and CLI processes, for before/after figures. The machine's load average (1
minute) is printed with the figures.

Usage::

    .venv/bin/python benchmarks/bench_live_loop.py loop --queued 5000
    .venv/bin/python benchmarks/bench_live_loop.py loop --queued 20000 \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    .venv/bin/python benchmarks/bench_live_loop.py drain --short 400 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

PY = sys.executable
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def database(url: str | None, home: Path) -> Iterator[str]:
    """A fresh database: SQLite in ``home``, or a new PostgreSQL database dropped after."""
    if url is None:
        home.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{home / 'gpupool.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"gpupool_bench_{secrets.token_hex(4)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Pool:
    """A server process and one agent process with simulated GPUs."""

    def __init__(self, root: Path, db_url: str, src: Path | None, gpus: str) -> None:
        self.root = root
        self.home = root / "home"
        self.env = {**os.environ, "GPUPOOL_HOME": str(self.home)}
        self.env.pop("GPUPOOL_DATABASE_URL", None)
        if src is not None:
            self.env["PYTHONPATH"] = f"{src}{os.pathsep}{self.env.get('PYTHONPATH', '')}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._spawn(
            "server",
            [
                *("server", "--home", str(self.home), "--port", str(self.port)),
                *("--database-url", db_url),
            ],
        )
        wait(self._ready, 120, "the server", every=0.2)
        self.token = (self.home / "admin-token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=600
        )
        self.http.post("/v1/users", json={"name": "bench-agent", "role": "agent"})
        secret = self.http.post("/v1/tokens", json={"user": "bench-agent"}).json()["secret"]
        (root / "agent-token").write_text(secret)
        self._spawn(
            "agent",
            [
                *("agent", "--server", self.url, "--token-file", str(root / "agent-token")),
                *("--simulate", gpus, "--node", "bench", "--state-dir", str(root / "agent")),
                *("--address", "127.0.0.1"),
            ],
        )
        wait(self._node_up, 120, "the agent", every=0.2)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the process
        self.procs.append(
            subprocess.Popen(
                [PY, "-m", "gpupool.cli", *args],
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _node_up(self) -> bool:
        r = self.http.get("/v1/nodes/bench")
        return r.status_code == 200 and r.json().get("last_heartbeat") is not None

    def submit(self, spec: dict[str, Any], array: str | None = None) -> list[str]:
        body: dict[str, Any] = {"spec": spec}
        if array is not None:
            body["array"] = array
        r = self.http.post("/v1/jobs", json=body)
        r.raise_for_status()
        data = r.json()
        return [j["id"] for j in data["array"]] if array is not None else [data["job"]["id"]]

    def state(self, job_id: str) -> str:
        return str(self.http.get(f"/v1/jobs/{job_id}").json()["state"])

    def jobs(self, state: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"state": state, "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = self.http.get("/v1/jobs", params=params).json()
            out.extend(page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def cycles(self) -> tuple[float, int]:
        """The server's scheduling cycles so far: (seconds in all, how many)."""
        text = self.http.get("/metrics").text
        total = re.search(r"^gpupool_scheduler_cycle_seconds_sum (\S+)$", text, re.M)
        count = re.search(r"^gpupool_scheduler_cycle_seconds_count (\S+)$", text, re.M)
        return (float(total.group(1)) if total else 0.0, int(float(count.group(1))) if count else 0)

    def close(self) -> None:
        agent, server = self.procs[1:2], self.procs[:1]
        for p in agent:
            self._stop(p)
        # the supervisors and jobs the agent left running (they outlive an agent by design)
        for state in (self.root / "agent").glob("jobs/*/state.json"):
            try:
                data = json.loads(state.read_text())
            except (OSError, ValueError):
                continue
            for key, kill in (("pid", os.killpg), ("supervisor_pid", os.kill)):
                if data.get(key):
                    with contextlib.suppress(OSError):
                        kill(int(data[key]), signal.SIGKILL)
        for p in server:
            self._stop(p)

    @staticmethod
    def _stop(p: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def load() -> float:
    return os.getloadavg()[0]


def sleep_spec(name: str, seconds: float, gpus: str, cpus: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["sleep", str(seconds)],
        "resources": {"gpus": gpus, "gpu_memory": "1GiB", "cpus": cpus},
        **extra,
    }


def scenario_loop(pool: Pool, args: argparse.Namespace) -> dict[str, Any]:
    blockers = [
        pool.submit(sleep_spec(f"big{i}", 36000, gpus, args.cpus))[0]
        for i, gpus in enumerate(("1", "1", "1", "0.5"))
    ]
    for b in blockers:
        wait(lambda b=b: pool.state(b) == "RUNNING", 300, "the blockers running", every=0.2)
    t0 = time.monotonic()
    left = args.queued
    while left:  # arrays of at most 10,000 tasks
        n = min(left, 10_000)
        pool.submit(sleep_spec("queued", 60, "1", args.cpus), array=f"0-{n - 1}")
        left -= n
    fill_s = time.monotonic() - t0
    # the first cycle that saw the whole queue, then --cycles quiet ones
    _, c0 = pool.cycles()
    wait(lambda: pool.cycles()[1] >= c0 + 2, 900, "two cycles with the queue", every=0.2)
    s1, c1 = pool.cycles()
    wait(lambda: pool.cycles()[1] >= c1 + args.cycles, 1800, "the measured cycles", every=0.2)
    s2, c2 = pool.cycles()
    cycle_s = (s2 - s1) / (c2 - c1)
    load_cycles = load()
    placed: list[float] = []
    running: list[float] = []
    for i in range(args.urgent):
        t = time.monotonic()
        (job,) = pool.submit(sleep_spec(f"urgent{i}", 36000, "0.1", args.cpus, priority="high"))
        state = wait(
            lambda j=job: (st := pool.state(j)) in ("CONFIGURING", "RUNNING") and st,
            900,
            "the urgent job placed",
        )
        placed.append(time.monotonic() - t)
        if state != "RUNNING":
            wait(lambda j=job: pool.state(j) == "RUNNING", 900, "the urgent job running")
        running.append(time.monotonic() - t)
        pool.http.post(f"/v1/jobs/{job}/cancel").raise_for_status()
        wait(
            lambda j=job: pool.state(j) in ("CANCELLED", "COMPLETED", "FAILED"),
            900,
            "the urgent job ended",
            every=0.2,
        )
    queue_s: list[float] = []
    for _ in range(args.runs):
        t = time.monotonic()
        subprocess.run(
            [PY, "-m", "gpupool.cli", "queue", "--server", pool.url, "--token", pool.token],
            env=pool.env,
            stdout=subprocess.DEVNULL,
            check=True,
        )
        queue_s.append(time.monotonic() - t)
    return {
        "queued": args.queued,
        "fill_s": round(fill_s, 1),
        "cycle_s_mean": round(cycle_s, 3),
        "cycles_measured": c2 - c1,
        "urgent_placed_s": [round(x, 2) for x in placed],
        "urgent_running_s": [round(x, 2) for x in running],
        "urgent_running_s_max": round(max(running), 2),
        "queue_cli_s": [round(x, 2) for x in queue_s],
        "queue_cli_s_median": round(statistics.median(queue_s), 2),
        "load1_during_cycles": round(load_cycles, 2),
    }


def max_overlap(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = now = 0
    for _, step in points:
        now += step
        best = max(best, now)
    return best


def scenario_drain(pool: Pool, args: argparse.Namespace) -> dict[str, Any]:
    load0 = load()
    t = time.monotonic()
    ids = pool.submit(
        sleep_spec("short", args.sleep, "0.1", args.cpus), array=f"0-{args.short - 1}"
    )
    ended = ("COMPLETED", "FAILED", "CANCELLED")

    def done() -> bool:
        return sum(len(pool.jobs(st)) for st in ended) >= len(ids)

    wait(done, 1800, "every short job ended", every=0.5)
    wall_s = time.monotonic() - t
    jobs = [j for st in ended for j in pool.jobs(st)]
    failed = [j["id"] for j in jobs if j["state"] != "COMPLETED"]
    spans = [(j["start_time"], j["end_time"]) for j in jobs if j["start_time"] and j["end_time"]]
    first_submit = min(j["submit_time"] for j in jobs)
    stages = drain_stages(pool, jobs, slots=40, sleep_s=args.sleep)
    return {
        "jobs": len(ids),
        "sleep_s": args.sleep,
        "gpus_each": 0.1,
        "cpus_each": args.cpus,
        "ideal_s": args.short / 40 * args.sleep,
        "makespan_s": round(max(e for _, e in spans) - first_submit, 1),
        "wall_s": round(wall_s, 1),
        "max_running_at_once": max_overlap(spans),
        "not_completed": len(failed),
        "load1_before": round(load0, 2),
        "load1_after": round(load(), 2),
        **stages,
    }


def drain_stages(
    pool: Pool, jobs: list[dict[str, Any]], slots: int, sleep_s: float
) -> dict[str, Any]:
    """Where each short job's start and end go (medians over the jobs, seconds), from the
    server's events (the agent deletes a finished job's folder, so its own times are gone):

    - ``place_after_free``: from the server recording the end that freed a slot to the next
      job's placement (CONFIGURING) -- the loop's part; the first ``slots`` jobs are left out;
    - ``placed_to_running``: placement to the agent reporting the process running -- the long
      poll, the heartbeat that fetches the order, the supervisor's start, the report;
    - ``end_overhead``: running to the server recording the end, less the job's own sleep --
      the process's exit, the supervisor's record, the agent's report."""
    placed: dict[str, float] = {}
    running: dict[str, float] = {}
    for j in jobs:
        events = pool.http.get(f"/v1/jobs/{j['id']}/events").json()
        placed[j["id"]] = max(e["time"] for e in events if e["target"] == "CONFIGURING")
        runs = [e["time"] for e in events if e["target"] == "RUNNING"]
        if runs:
            running[j["id"]] = max(runs)
    order = sorted(jobs, key=lambda j: placed[j["id"]])
    freed = sorted(j["end_time"] for j in jobs if j["end_time"])
    after_free = [placed[j["id"]] - freed[i - slots] for i, j in enumerate(order) if i >= slots]
    to_running = [running[k] - placed[k] for k in running]
    end_extra = [j["end_time"] - running[j["id"]] - sleep_s for j in jobs if j["id"] in running]

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 3) if xs else None

    return {
        "place_after_free_s_median": med(after_free),
        "placed_to_running_s_median": med(to_running),
        "end_overhead_s_median": med(end_extra),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=("loop", "drain"))
    parser.add_argument("--queued", type=int, default=5000, help="loop: jobs queued")
    parser.add_argument("--cycles", type=int, default=3, help="loop: cycles measured")
    parser.add_argument("--urgent", type=int, default=3, help="loop: urgent jobs, one by one")
    parser.add_argument("--runs", type=int, default=2, help="loop: gpupool queue runs")
    parser.add_argument("--short", type=int, default=400, help="drain: jobs")
    parser.add_argument("--sleep", type=float, default=2.0, help="drain: each job's sleep, s")
    parser.add_argument("--cpus", default="10m", help="CPUs each job asks for")
    parser.add_argument("--gpus", default="4xA100-80GB", help="the agent's simulated GPUs")
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (default SQLite)")
    parser.add_argument("--src", type=Path, default=None, help="run another checkout's src")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-live-"))
    with database(args.database_url, root / "home") as db_url:
        pool = Pool(root, db_url, args.src, args.gpus)
        try:
            run = scenario_loop if args.scenario == "loop" else scenario_drain
            result = {
                "scenario": args.scenario,
                "store": "postgresql" if args.database_url else "sqlite",
                "src": str(args.src) if args.src else "this checkout",
                "cpus_online": os.cpu_count(),
                **run(pool, args),
            }
        finally:
            pool.close()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
