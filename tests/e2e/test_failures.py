"""End to end: agents that are killed and restarted, and agents that disappear."""

from __future__ import annotations

import pytest

from tests.e2e.pool import Pool, wait_for


def test_a_killed_agent_restarts_and_readopts_its_jobs_without_relaunching(
    fresh_pool: Pool,
) -> None:
    pool = fresh_pool
    codes = {"keep0": 0, "keep1": 3, "keep2": 0, "keep3": 5}
    jobs = {n: pool.submit(n, "wait", resources={"gpus": "0.5"}) for n in codes}
    for name, job_id in jobs.items():
        pool.wait_state(job_id, "RUNNING")
        wait_for(lambda n=name: pool.record(n), 30, f"{name} to start")
    nodes = {pool.record(n)["env"]["GPUPOOL_NODE"] for n in jobs}  # type: ignore[index]
    for node in nodes:
        pool.kill_agent(node)
    for node in nodes:
        pool.start_agent(node)
    for name, code in codes.items():
        (pool.out / f"{name}.code").write_text(str(code))
        (pool.out / f"{name}.go").write_text("")
    for name, job_id in jobs.items():
        done = pool.wait_state(job_id, "COMPLETED", "FAILED", timeout=60)
        assert done["exit_code"] == codes[name]
        assert done["state"] == ("COMPLETED" if codes[name] == 0 else "FAILED")
        assert done["restart_count"] == 0
        assert pool.starts(name) == [0], f"{name} was started again"


@pytest.mark.parametrize("fresh_pool", [4.0], indirect=True)
def test_a_vanished_agent_is_marked_down_and_its_jobs_rerun_elsewhere(fresh_pool: Pool) -> None:
    pool = fresh_pool
    job_id = pool.submit("mover", "forever", resources={"gpus": "0.5"})
    pool.wait_state(job_id, "RUNNING")
    first = wait_for(lambda: pool.record("mover"), 30, "mover to start")
    lost = first["env"]["GPUPOOL_NODE"]
    survivor = ({"n1", "n2"} - {lost}).pop()
    pool.kill_agent(lost)
    wait_for(lambda: (pool.node(lost) or {}).get("state") == "down", 30, f"{lost} marked down")
    done = pool.wait_state(job_id, "COMPLETED", timeout=60)
    assert done["restart_count"] == 1
    again = pool.record("mover", restart=1)
    assert again is not None
    assert again["env"]["GPUPOOL_NODE"] == survivor
    assert again["env"]["GPUPOOL_CHECKPOINT_DIR"] == first["env"]["GPUPOOL_CHECKPOINT_DIR"]
