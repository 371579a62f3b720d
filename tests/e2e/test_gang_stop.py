"""End to end: a gang spread over two nodes dies together, and the surviving replica's node
hears of it at once (its agent's long poll is woken), not at its next periodic heartbeat.

The heartbeat interval here is long (``HEARTBEAT_S``), so the difference shows: the sibling
must be stopped well within a third of it. The server used to record the sibling's stop order
without ringing its node, so the order waited for that node's next heartbeat.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import PY, Pool, wait_for

HEARTBEAT_S = 120.0

#: Rank 1 waits for <out>/go, then exits 3; rank 0 runs until stopped and notes the SIGTERM.
GANG = r"""
import os, signal, sys, time
out, rank = sys.argv[1], os.environ["RANK"]
def on_term(*_):
    open(os.path.join(out, "stopped." + rank), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "up." + rank), "w").close()
while rank == "1" and not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
if rank == "1":
    sys.exit(3)
while True:
    time.sleep(1)
"""


class _Pool(Pool):
    """A pool whose processes also get this test's ``PYTHONPATH`` first (to run them on an
    older tree of the code: ``PYTHONPATH=/tmp/old/src pytest ...``)."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        first = os.environ.get("PYTHONPATH")
        if first:
            env["PYTHONPATH"] = os.pathsep.join([first, env["PYTHONPATH"]])
        return env


@pytest.fixture
def slow_beat_pool(tmp_path: Path) -> Iterator[Pool]:
    """Two one-GPU nodes whose agents heartbeat every ``HEARTBEAT_S`` seconds."""
    p = _Pool(tmp_path, heartbeat_s=HEARTBEAT_S, node_timeout_s=10 * HEARTBEAT_S)
    try:
        p.start_server()
        p.start_agent("n1", "1xA100-80GB")
        p.start_agent("n2", "1xA100-80GB")
        yield p
    finally:
        p.close()


def test_a_gang_replica_that_fails_stops_its_sibling_on_the_other_node_at_once(
    slow_beat_pool: Pool,
) -> None:
    pool = slow_beat_pool
    body = {
        "name": "pair",
        "command": [PY, "-c", GANG, str(pool.out)],
        "replicas": 2,
        "resources": {"gpus": 1, "cpus": "100m"},
        "requeue": "never",
    }
    job_id = str(pool.post("/v1/jobs", {"spec": body})["job"]["id"])
    pool.wait_state(job_id, "RUNNING", timeout=90)
    for rank in (0, 1):
        wait_for(lambda r=rank: (pool.out / f"up.{r}").exists(), 60, f"rank {rank} to start")
    nodes = set(pool.job(job_id)["nodes"])
    assert nodes == {"n1", "n2"}, "the gang must span both nodes"
    # Let both agents finish the heartbeat rounds that launched and reported their replica:
    # an agent reports a change it sees during a round only at its next periodic heartbeat
    # (agent.py's loop), which would hide what this test looks at. Not an assertion.
    time.sleep(2.0)
    (pool.out / "go").write_text("")  # rank 1 exits 3 now
    wait_for(
        (pool.out / "stopped.0").exists,
        HEARTBEAT_S / 3,
        "rank 0 to receive its stop before its node's next periodic heartbeat",
    )
    done = pool.wait_state(job_id, "FAILED", timeout=HEARTBEAT_S / 3)
    assert done["exit_code"] == 3
