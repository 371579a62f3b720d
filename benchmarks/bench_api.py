"""Control-plane benchmark: submit throughput and latency, and submit-to-assignment latency.

Usage::

    .venv/bin/python benchmarks/bench_api.py                 # SQLite and PostgreSQL, a table
    .venv/bin/python benchmarks/bench_api.py --json          # the same figures as JSON
    .venv/bin/python benchmarks/bench_api.py --stores sqlite --submits 2000 --nodes 1000
    .venv/bin/python benchmarks/bench_api.py --stores postgres --phases submits   # no nodes

What it measures, each against a real ``gpupool server`` process on a free port:

1. **submits**: ``--clients`` keep-alive connections (default 50; the lean client of
   ``rawhttp.py``) send ``--submits`` job submits (each with an idempotency key) as fast as
   the server answers; reports submits per second and per-request latency p50/p90/p99/max
   (milliseconds, client side, including HTTP). Then, with ``--rate R`` (default 500; 0 skips
   it), the same number again at R submits/s offered, latency counted from when each submit
   was due. The server runs with ``--no-schedule --workers N`` (``--workers``, default 1)
   here, so the figures are the API and store path alone.
2. **submit-to-assignment**: a server with the scheduling loop registers ``--nodes`` simulated
   nodes (4 GPUs each, registered through the agent API; no heartbeats are sent, the node
   timeout is set past the run), then ``--placements`` jobs are submitted one at a time and
   each is polled until the scheduler has committed its assignment (state CONFIGURING).
   Reports p50/p99 of that latency.

PostgreSQL runs on ``--pg`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``)
in a fresh database that is dropped afterwards. The client runs on the same machine as the
server, so both share its CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from rawhttp import Connection

LAUNCH = "from gpupool.cli.main import main; main()"
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: Server workers for the submit phase. One worker's group commit keeps up with the target on
#: two cores shared with the client and PostgreSQL; more workers pay off with more cores.
DEFAULT_WORKERS = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Server:
    def __init__(self, home: Path, database_url: str | None, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-c",
            LAUNCH,
            "server",
            "--home",
            str(home),
            "--port",
            str(self.port),
        ]
        if database_url:
            cmd += ["--database-url", database_url]
        env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_DATABASE_URL"}
        self.log = open(home.parent / f"server-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*cmd, *args], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not start")
        self.token = (home / "admin-token").read_text().strip()
        self.headers = {"Authorization": f"Bearer {self.token}"}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


def _job(i: int, gpus: str = "0.25") -> dict[str, Any]:
    return {"spec": {"name": f"bench-{i}", "command": ["true"], "resources": {"gpus": gpus}}}


async def submit_burst(
    server: Server, total: int, clients: int, rate: float = 0.0
) -> dict[str, float]:
    """``clients`` keep-alive connections send ``total`` submits (each with its own key).

    ``rate`` 0: each client sends its next submit as soon as the last one is answered (the
    most the server does). ``rate`` R: submit i is due at ``start + i / R`` and is sent by a
    free client then (or as soon as one is free); its latency counts from when it was due,
    so a server that falls behind is charged for the wait (no coordinated omission)."""
    latencies: list[float] = []
    retries: list[int] = []
    counter = iter(range(total))
    conns = [Connection("127.0.0.1", server.port, server.headers) for _ in range(clients)]

    run = secrets.token_hex(3)  # keys differ between runs on one server

    def request(conn: Connection, i: int, key: bool = True) -> bytes:
        body = json.dumps(_job(i)).encode()
        extra = f"Idempotency-Key: b{run}-{i}\r\n" if key else ""
        return conn.head("POST", "/v1/jobs", body, extra) + body

    start = 0.0

    async def worker(conn: Connection) -> None:
        for i in counter:
            raw = request(conn, i)
            t0 = time.perf_counter()
            if rate > 0:
                due = start + i / rate
                if due > t0:
                    await asyncio.sleep(due - t0)
                t0 = due
            for attempt in range(5):  # the key makes a retry after a dropped connection safe
                try:
                    status, payload = await conn.send(raw)
                    break
                except (OSError, asyncio.IncompleteReadError):
                    retries.append(i)
                    if attempt == 4:
                        raise
            latencies.append(time.perf_counter() - t0)
            if status != 201:
                raise RuntimeError(f"submit failed: {status} {payload[:500]!r}")

    # warm-up: every worker process up, connections open, caches and database pages warm
    warm, deadline = 0, time.monotonic() + 60
    while warm < 100 and time.monotonic() < deadline:
        conn = conns[warm % clients]
        try:
            status, _ = await conn.send(request(conn, -warm - 1, key=False))
            warm += status == 201
        except (OSError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.2)
    for conn in conns:  # open the rest, so the timed part has every connection ready
        await conn.send(request(conn, -1, key=False))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    for conn in conns:
        conn.close()
    client_cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {
        "submits": total,
        "clients": clients,
        "offered_per_s": rate or None,
        "seconds": elapsed,
        "submits_per_s": total / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p90_ms": percentile(latencies, 90) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000,
        "retries": len(retries),
        "client_cpu_ms_per_submit": client_cpu / total * 1000,
    }


def register_nodes(server: Server, nodes: int) -> None:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as c:
        c.post("/v1/users", json={"name": "bench-agent", "role": "agent"})
        secret = c.post("/v1/tokens", json={"user": "bench-agent"}).json()["secret"]
    agent = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=server.url, headers=agent, timeout=30) as c:
        for n in range(nodes):
            devices = [
                {"uuid": f"sim-{n}-{g}", "index": g, "model": "A100-SXM4-80GB", "memory_mib": 81920}
                for g in range(4)
            ]
            body = {
                "node": f"sim-{n:04d}",
                "cpu_milli": 64000,
                "memory_mib": 524288,
                "agent_version": "bench",
                "devices": devices,
            }
            r = c.post("/v1/agent/register", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"register failed: {r.text}")


def placement_latency(server: Server, placements: int) -> dict[str, float]:
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as c:
        for i in range(placements):
            t0 = time.perf_counter()
            job = c.post("/v1/jobs", json=_job(i, "0.5")).json()["job"]["id"]
            while True:
                state = c.get(f"/v1/jobs/{job}").json()["state"]
                if state != "PENDING":
                    break
                time.sleep(0.002)
            latencies.append(time.perf_counter() - t0)
    return {
        "placements": placements,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000,
    }


def fresh_pg(admin_url: str) -> tuple[str, str]:
    name = f"gpupool_bench_{secrets.token_hex(4)}"
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), name


def drop_pg(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def run_store(store: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"store": store}
    for phase in args.phases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url, dbname = (None, None)
            if store == "postgres":
                url, dbname = fresh_pg(args.pg)
            try:
                extra: tuple[str, ...] = ("--node-timeout", "86400")
                if phase == "submits":
                    extra = ("--no-schedule", "--workers", str(args.workers))
                server = Server(Path(tmp) / "home", url, *extra)
                try:
                    if phase == "submits":
                        result["submit"] = asyncio.run(
                            submit_burst(server, args.submits, args.clients)
                        )
                        if args.rate:
                            result["submit_at_rate"] = asyncio.run(
                                submit_burst(server, args.submits, args.clients, args.rate)
                            )
                    else:
                        register_nodes(server, args.nodes)
                        result["assign"] = placement_latency(server, args.placements)
                        result["assign"]["nodes"] = args.nodes
                finally:
                    server.close()
            finally:
                if dbname is not None:
                    drop_pg(args.pg, dbname)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--submits", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--placements", type=int, default=50)
    parser.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="server workers for submits"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="also run the submits at this offered rate (submits/s over all clients; 0: don't)",
    )
    parser.add_argument("--phases", default="submits,placement", help="which parts to run")
    parser.add_argument("--pg", default=DEFAULT_PG)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = [run_store(s.strip(), args) for s in args.stores.split(",") if s.strip()]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"| store | submits/s ({args.clients} clients, {args.workers} workers) | p50 ms | "
        f"p99 ms | at {args.rate:.0f}/s offered: p50 ms | p99 ms | "
        f"submit-to-assignment p50 ms | p99 ms ({args.nodes} nodes) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in results:
        s, q, a = r.get("submit", {}), r.get("submit_at_rate", {}), r.get("assign", {})
        cells = [
            f"{s.get('submits_per_s', nan):.0f}",
            f"{s.get('p50_ms', nan):.1f}",
            f"{s.get('p99_ms', nan):.1f}",
            f"{q.get('p50_ms', nan):.1f}",
            f"{q.get('p99_ms', nan):.1f}",
            f"{a.get('p50_ms', nan):.0f}",
            f"{a.get('p99_ms', nan):.0f}",
        ]
        print(f"| {r['store']} | " + " | ".join(cells) + " |")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
