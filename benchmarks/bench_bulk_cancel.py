"""Bulk cancel benchmark (issues 26 and 27): cancel 2,000 held jobs in one request.

Usage::

    .venv/bin/python benchmarks/bench_bulk_cancel.py                    # SQLite and PostgreSQL
    .venv/bin/python benchmarks/bench_bulk_cancel.py --stores sqlite --jobs 2000 --json
    .venv/bin/python benchmarks/bench_bulk_cancel.py --per-job 100      # also one by one

What it measures, against a real ``gpupool server`` process (scheduling loop on, no nodes) on a
free port, for each store:

1. ``--jobs`` held jobs are submitted as one job array (one request, not timed);
2. **bulk**: ``POST /v1/jobs/bulk {"action": "cancel", "array": ...}``: the wall time of that
   one request (client side, HTTP included) and the server's CPU seconds over it (from
   ``/proc/PID/stat``); every job is then checked ``CANCELLED``;
3. **cli**: the same through ``gpupool cancel -a ARRAY`` on a second array of the same size,
   the command's wall time (its own start-up included);
4. with ``--per-job N``: N held jobs cancelled one request each (``POST .../cancel``), the
   mean per request, for comparison.

The load average (``/proc/loadavg``) is printed with the figures: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench_api import DEFAULT_PG, LAUNCH, Server, drop_pg, fresh_pg

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _held_array(http: httpx.Client, jobs: int, name: str) -> str:
    spec = {"name": name, "command": ["true"], "resources": {"gpus": "0.1"}}
    r = http.post("/v1/jobs", json={"spec": spec, "array": f"0-{jobs - 1}", "hold": True})
    r.raise_for_status()
    return str(r.json()["job"]["array_id"])


def _states(http: httpx.Client, array_id: str) -> set[str]:
    """The states of an array's tasks (every page of ``GET /v1/jobs?array=``)."""
    params: dict[str, Any] = {"array": array_id, "limit": 1000}
    found: set[str] = set()
    while True:
        page = http.get("/v1/jobs", params=params).json()
        found |= {j["state"] for j in page["jobs"]}
        if not page.get("next_cursor"):
            return found
        params["cursor"] = page["next_cursor"]


def run_store(store: str, jobs: int, per_job: int, pg: str) -> dict[str, Any]:
    out: dict[str, Any] = {"store": store, "jobs": jobs}
    dropped: str | None = None
    url = None
    if store == "postgres":
        url, dropped = fresh_pg(pg)
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=120) as http:
        home = Path(tmp) / "home"
        home.mkdir()
        server = Server(home, url)
        http.base_url = httpx.URL(server.url)
        http.headers.update(server.headers)
        try:
            array_id = _held_array(http, jobs, "bulk")
            cpu0, t0 = _cpu_s(server.proc.pid), time.perf_counter()
            r = http.post("/v1/jobs/bulk", json={"action": "cancel", "array": array_id})
            out["bulk_s"] = time.perf_counter() - t0
            out["bulk_server_cpu_s"] = _cpu_s(server.proc.pid) - cpu0
            r.raise_for_status()
            out["bulk_changed"] = len(r.json()["changed"])
            assert _states(http, array_id) == {"CANCELLED"}
            array_id = _held_array(http, jobs, "cli")
            env = {**os.environ, "GPUPOOL_SERVER": server.url, "GPUPOOL_TOKEN": server.token}
            t0 = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", LAUNCH, "cancel", "-a", array_id],
                env=env,
                capture_output=True,
                check=True,
            )
            out["cli_s"] = time.perf_counter() - t0
            out["cli_lines"] = done.stdout.count(b": CANCELLED")
            assert _states(http, array_id) == {"CANCELLED"}
            if per_job:
                spec = {"name": "one", "command": ["true"], "resources": {"gpus": "0.1"}}
                body = {"spec": spec, "array": f"0-{per_job - 1}", "hold": True}
                tasks = http.post("/v1/jobs", json=body).json()["array"]
                t0 = time.perf_counter()
                for task in tasks:
                    http.post(f"/v1/jobs/{task['id']}/cancel", json={}).raise_for_status()
                out["per_job_mean_s"] = (time.perf_counter() - t0) / per_job
        finally:
            server.close()
    if dropped is not None:
        drop_pg(pg, dropped)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--per-job", type=int, default=0, help="also cancel N jobs one by one")
    ap.add_argument("--pg", default=DEFAULT_PG)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [
        run_store(s.strip(), args.jobs, args.per_job, args.pg) for s in args.stores.split(",")
    ]
    load = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        print(json.dumps({"results": results, "loadavg": load}, indent=2))
        return
    print(f"cancel {args.jobs} held jobs (load average {' '.join(load)})")
    print(f"{'store':10} {'bulk request':>13} {'server CPU':>11} {'gpupool cancel -a':>18}")
    for r in results:
        print(
            f"{r['store']:10} {r['bulk_s']:>12.3f}s {r['bulk_server_cpu_s']:>10.2f}s "
            f"{r['cli_s']:>17.2f}s"
            + (f"   one by one: {r['per_job_mean_s'] * 1000:.1f} ms each" if args.per_job else "")
        )


if __name__ == "__main__":
    main()
