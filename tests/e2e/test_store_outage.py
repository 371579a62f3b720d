"""End to end: the server's PostgreSQL goes away while jobs run (issue 18 item 4).

While the store is down the server answers agents 503 and records no heartbeat; when it
returns, that silence must not be held against the nodes. The test runs a throwaway PostgreSQL
cluster of its own (see ``tests/api/test_pg_outage.py``), a real ``gpupool server`` on it and
two real agent processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_pg_outage import Cluster
from tests.e2e.pool import Pool, wait_for

pytestmark = [pytest.mark.postgres]

NODE_TIMEOUT_S = 3.0


@pytest.fixture
def pg_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Pool, Cluster]]:
    cluster = Cluster()
    cluster.start()
    monkeypatch.setenv("GPUPOOL_DATABASE_URL", cluster.url)  # the server's store; agents ignore it
    p = Pool(tmp_path, node_timeout_s=NODE_TIMEOUT_S)
    try:
        p.start_server()
        p.start_agent("n1")
        p.start_agent("n2")
        yield p, cluster
    finally:
        p.close()
        cluster.destroy()


def _beats_after(pool: Pool, moment: float) -> bool:
    try:
        nodes = pool.get("/v1/nodes")
    except AssertionError:  # 503 while the store settles
        return False
    return bool(nodes) and min(n["last_heartbeat"] for n in nodes) > moment


def test_postgres_down_twice_the_node_timeout_costs_no_running_job(
    pg_pool: tuple[Pool, Cluster],
) -> None:
    pool, cluster = pg_pool
    jobs = [pool.submit(f"keep{i}", "forever", resources={"gpus": "0.5"}) for i in range(4)]
    for job_id in jobs:
        pool.wait_state(job_id, "RUNNING")
    cluster.stop()
    # The scenario itself: the store stays away for twice the node timeout.
    time.sleep(2 * NODE_TIMEOUT_S)
    assert pool.http is not None
    assert pool.http.get("/readyz").status_code == 503
    cluster.start()
    back = time.time()
    # Heartbeats recorded well past one node timeout after the store returned: the server
    # has been judging nodes again for a while by then.
    wait_for(lambda: _beats_after(pool, back + 2 * NODE_TIMEOUT_S), 90, "heartbeats after")
    for node in pool.get("/v1/nodes"):
        assert node["state"] == "up", node
    for job_id in jobs:
        job = pool.job(job_id)
        assert (job["state"], job["restart_count"]) == ("RUNNING", 0), job
        targets = [e["target"] for e in pool.get(f"/v1/jobs/{job_id}/events")]
        assert "NODE_FAIL" not in targets, targets
    downs = [e for e in pool.get("/v1/events") if e["kind"] == "node.down"]
    assert downs == [], downs
