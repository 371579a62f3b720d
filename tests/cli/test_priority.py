"""``gpupool priority`` (Slurm's sprio, issue 27): every pending job's priority factors, as the
scheduler ranked them, highest first; over the live pool of ``conftest.py`` (a server with its
scheduler and an agent), as a user runs the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from gpupool.client import Client
from tests.cli.conftest import LocalPool, Result

Cli = Callable[..., Result]
HEAD = ["JOBID", "POOL", "USER", "TENANT", "CLASS", "PRIORITY"]


def _ranked(pool: LocalPool, ids: set[str]) -> dict[str, dict[str, object]]:
    """``GET /v1/priorities`` once the scheduler has ranked every job of ``ids``."""
    headers = {"Authorization": f"Bearer {pool.admin_token}"}
    deadline = time.monotonic() + 120
    while True:
        rows = httpx.get(f"{pool.url}/v1/priorities", headers=headers, timeout=30).json()["jobs"]
        found = {r["id"]: r for r in rows if r["id"] in ids}
        if len(found) == len(ids) and all(r["factors"] for r in found.values()):
            return {**{r["id"]: r for r in rows}, "_order": [r["id"] for r in rows]}  # type: ignore[dict-item]
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)


def test_priority_lists_each_pending_job_s_factors_as_the_scheduler_ranked_them(
    pool_env: LocalPool, cli: Cli
) -> None:
    # Too large for the pool (queued anyway), so they stay pending and ranked.
    big = ["--queue-anyway", "-g", "8", "--", "true"]
    high = cli("submit", "--parsable", "-J", "prio-high", "-q", "high", *big).stdout.strip()
    low = cli("submit", "--parsable", "-J", "prio-low", "-q", "low", *big).stdout.strip()
    try:
        ranked = _ranked(pool_env, {high, low})
        order: list[str] = ranked["_order"]  # type: ignore[assignment]
        assert order.index(high) < order.index(low)  # the scheduler's order, highest first
        with Client(pool_env.url, pool_env.admin_token) as gp:
            for job_id in (high, low):
                row = ranked[job_id]
                factors = row["factors"]
                assert isinstance(factors, list)
                names = [f["name"] for f in factors]
                assert names == ["priority", "size", "age", "fairshare", "efficiency"]
                total = sum(f["contribution"] for f in factors)
                assert abs(row["priority"] - total) < 1e-9  # type: ignore[operator]
                shown = gp.get(job_id).priority_factors  # the same table show explains
                assert shown is not None
                assert [f.name for f in shown] == names
                assert [f.weight for f in shown] == [f["weight"] for f in factors]
        r = cli("priority", "-u", "admin")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        head = lines[0].split()
        assert head == [*HEAD, "QOS", "JOBSIZE", "AGE", "FAIRSHARE", "EFFICIENCY"]
        ids = [line.split()[0] for line in lines[2:]]
        assert ids.index(high) < ids.index(low)
        high_row = next(line for line in lines if line.startswith(high)).split()
        assert high_row[1:5] == ["default", "admin", "default", "high"]
        assert float(high_row[5]) >= float(next(x for x in lines if x.startswith(low)).split()[5])
        norm = cli("priority", "-n").stdout
        assert norm.splitlines()[0].split()[-5:] == head[-5:]
        weights = cli("priority", "-w").stdout.splitlines()
        assert weights[0].split() == ["FACTOR", "WEIGHT", "MEANING"]
        assert [w.split()[0] for w in weights[2:]] == head[-5:]
    finally:
        with Client(pool_env.url, pool_env.admin_token) as gp:
            gp.bulk("cancel", ids=[high, low])


def test_priority_of_a_user_without_pending_jobs_lists_none(pool_env: LocalPool, cli: Cli) -> None:
    r = cli("priority", "-u", "nobody-at-all")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:6] == HEAD
    assert len(r.stdout.splitlines()) == 2  # the header and its rule, no job
