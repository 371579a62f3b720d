"""Server CPU per request: a figure that does not depend on the machine's load.

Usage::

    .venv/bin/python benchmarks/bench_api_cpu.py                        # SQLite, 400 each
    .venv/bin/python benchmarks/bench_api_cpu.py --store postgres -n 1000
    .venv/bin/python benchmarks/bench_api_cpu.py --clients 50          # concurrent, batched

A real ``gpupool server --no-schedule`` (``--workers``, default 1) on a free port; for each
route, ``-n`` requests are sent (sequentially with ``--clients 1``, else by that many
concurrent keep-alive connections) after a warm-up, and the server's user+system CPU time
(``/proc/<pid>/stat``, the server process and all its children) over those requests is
divided by their number. Other processes' load changes wall time, not this figure (beyond
cache effects). PostgreSQL's own CPU is not counted (it is another process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import DEFAULT_PG, Server, drop_pg, fresh_pg
from rawhttp import Connection

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of ``pid`` and its descendants."""
    total = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except OSError:
            continue
    return total / TICK


async def measure(
    server: Server, route: str, n: int, clients: int, warm: int = 100
) -> dict[str, float]:
    host, port = "127.0.0.1", server.port
    conns = [Connection(host, port, server.headers) for _ in range(clients)]
    job = {"spec": {"name": "cpu", "command": ["true"], "resources": {"gpus": "0.25"}}}
    body = json.dumps(job).encode()
    method, path = {"submit": ("POST", "/v1/jobs"), "whoami": ("GET", "/v1/whoami")}.get(
        route, ("GET", "/healthz")
    )
    expect = 201 if route == "submit" else 200
    prefix = os.urandom(4).hex()

    def raw(conn: Connection, i: int) -> bytes:
        if route != "submit":
            return conn.head(method, path, b"")
        return conn.head(method, path, body, f"Idempotency-Key: {prefix}-{i}\r\n") + body

    async def run(count: int, offset: int) -> None:
        it = iter(range(offset, offset + count))

        async def worker(conn: Connection) -> None:
            for i in it:
                status, payload = await conn.send(raw(conn, i))
                if status != expect:
                    raise RuntimeError(f"{route}: {status} {payload[:300]!r}")

        await asyncio.gather(*(worker(c) for c in conns))

    await run(warm, 0)
    client0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
    await run(n, warm)
    cpu1, t1 = cpu_seconds(server.proc.pid), time.perf_counter()
    client1 = resource.getrusage(resource.RUSAGE_SELF)
    for c in conns:
        c.close()
    client_cpu = (client1.ru_utime + client1.ru_stime) - (client0.ru_utime + client0.ru_stime)
    return {
        "requests": n,
        "server_cpu_ms_per_request": (cpu1 - cpu0) / n * 1000,
        "client_cpu_ms_per_request": client_cpu / n * 1000,
        "requests_per_s": n / (t1 - t0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("-n", type=int, default=400, help="requests per route")
    parser.add_argument("--clients", type=int, default=1, help="concurrent connections")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--routes", default="submit,whoami,healthz")
    parser.add_argument("--pg", default=DEFAULT_PG)
    args = parser.parse_args()
    results: dict[str, Any] = {"store": args.store, "clients": args.clients}
    with tempfile.TemporaryDirectory() as tmp:
        url, dbname = fresh_pg(args.pg) if args.store == "postgres" else (None, None)
        try:
            server = Server(
                Path(tmp) / "home", url, "--no-schedule", "--workers", str(args.workers)
            )
            try:
                for route in args.routes.split(","):
                    results[route] = asyncio.run(measure(server, route, args.n, args.clients))
            finally:
                server.close()
        finally:
            if dbname is not None:
                drop_pg(args.pg, dbname)
    results["loadavg"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
