"""A rack boots at once (issue 26, at the scale CI allows): 300 fake agents start together
against a real ``gpupool server`` process, in this test's process.

The agents are the fleet benchmark's (``benchmarks/fleet.py``): each speaks the agent protocol
as ``gpupool agent`` does (register, a heartbeat every interval with telemetry for 8 GPUs and
its replicas' states, the long poll, start and end reports), so the server cannot tell them
from real agents. The test asserts what the issue asks of the control plane under that burst:
every node registers, no node is marked down (none stops heartbeating, so any ``node.down``
is wrong), and jobs placed on them start. It watches for a whole node timeout after the last
registration, so a node the server stopped hearing would have been marked down meanwhile.

Timing is generous for a loaded 2-core machine: heartbeats every 4 s, a 20 s node timeout,
a minute for everyone to register, a minute for the jobs to start. Speed itself is measured by
``benchmarks/bench_fleet.py``, not here.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.pool import Pool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fleet import FakeNode, FleetStats, run_fleet

NODES = 300
JOBS = 24
HEARTBEAT_S = 4.0
NODE_TIMEOUT_S = 20.0


async def _until(probe: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.25)


async def _boot_a_rack(pool: Pool, stats: FleetStats) -> list[str]:
    token = pool.agent_token.read_text().strip()
    nodes = [
        FakeNode(f"rack-{i:03d}", "127.0.0.1", pool.port, token, stats, seed=i)
        for i in range(NODES)
    ]
    stop = asyncio.Event()
    fleet = asyncio.create_task(run_fleet(nodes, stop, join_s=0.0))  # all at once
    try:
        await _until(
            lambda: len(stats.registered_at) == NODES or fleet.done(),
            60,
            f"{NODES} nodes to register (have {len(stats.registered_at)})",
        )
        registered = time.monotonic()
        mix = [(1, "8"), ("0.5", "6"), (8, "10"), (2, "4")]
        jobs = [
            await asyncio.to_thread(
                pool.post,
                "/v1/jobs",
                {
                    "spec": {
                        "name": f"rack-job-{i}",
                        "command": ["sleep", mix[i % 4][1]],
                        "resources": {"gpus": mix[i % 4][0]},
                    }
                },
            )
            for i in range(JOBS)
        ]
        ids = [str(j["job"]["id"]) for j in jobs]
        await _until(
            lambda: all(i in stats.job_started_at for i in ids),
            60,
            f"the jobs' start orders to reach their nodes ({len(stats.job_started_at)}/{JOBS})",
        )
        # A node the server stopped hearing would be down one node timeout later.
        await asyncio.sleep(
            max(0.0, registered + NODE_TIMEOUT_S + 2 * HEARTBEAT_S - time.monotonic())
        )
        return ids
    finally:
        stop.set()
        await fleet


@pytest.mark.slow
def test_300_agents_booting_at_once_all_register_none_is_marked_down_and_their_jobs_start(
    tmp_path: Path,
) -> None:
    pool = Pool(tmp_path, heartbeat_s=HEARTBEAT_S, node_timeout_s=NODE_TIMEOUT_S)
    stats = FleetStats()
    try:
        pool.start_server()
        ids = asyncio.run(_boot_a_rack(pool, stats))
        downs = pool.get("/v1/events?kind=node.down&limit=1000")
        nodes = pool.get("/v1/nodes")
        states = {pool.job(i)["state"] for i in ids}
    finally:
        pool.close()
    assert len(stats.registered_at) == NODES
    assert downs == [], f"nodes marked down while heartbeating: {downs[:5]}"
    assert len(nodes) == NODES
    assert {n["state"] for n in nodes} == {"up"}
    assert states <= {"RUNNING", "COMPLETED"}, states
    assert stats.replicas_started >= JOBS
