"""Preemption through the live server: a job that needs one slot takes exactly one victim.

The victims here ignore SIGTERM, so each stays COMPLETING for its whole grace period and the
scheduling loop runs many cycles while it stops. Every one of those cycles must see that the
high-priority job already has a replica stopping for it and wait, instead of choosing another
victim (the live server used to store the stop *reason* where the snapshot expects the id of the
job the stop makes room for, so each cycle preempted one more job).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import PY, Pool, wait_for

#: Ignores SIGTERM (a slow checkpoint): stopped only by the SIGKILL after its grace period.
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)\n"
GRACE_S = 12


@pytest.fixture
def three_gpu_pool(tmp_path: Path) -> Iterator[Pool]:
    p = Pool(tmp_path)
    try:
        p.start_server()
        p.start_agent("n1", "3xA100-80GB")
        yield p
    finally:
        p.close()


def _submit(pool: Pool, name: str, command: list[str], **spec: object) -> str:
    body = {"name": name, "command": command, **spec}
    return str(pool.post("/v1/jobs", {"spec": body})["job"]["id"])


def test_a_high_priority_job_needing_one_slot_preempts_exactly_one_of_three(
    three_gpu_pool: Pool,
) -> None:
    pool = three_gpu_pool
    low = [
        _submit(
            pool,
            f"low{i}",
            [PY, "-c", STUBBORN],
            priority="low",
            preemptible=True,
            resources={"gpus": 1, "cpus": "100m"},
            checkpoint={"grace": f"{GRACE_S}s"},
        )
        for i in range(3)
    ]
    for job_id in low:
        pool.wait_state(job_id, "RUNNING", timeout=90)
    high = _submit(
        pool,
        "high",
        [PY, "-c", "print('ok')"],
        priority="high",
        resources={"gpus": 1, "cpus": "100m"},
    )
    # The first victim stops within its grace (then SIGKILL); cycles run all the while.
    wait_for(lambda: any(pool.job(j)["state"] != "RUNNING" for j in low), 60, "a victim")
    done = pool.wait_state(high, "COMPLETED", "FAILED", timeout=GRACE_S + 90)
    assert done["state"] == "COMPLETED", done
    victims = [
        j
        for j in low
        if any(f"preempted for job {high}" in str(e) for e in pool.get(f"/v1/jobs/{j}/events"))
    ]
    assert len(victims) == 1, {j: pool.get(f"/v1/jobs/{j}/events") for j in low}
