"""End to end: nodes with more than one GPU model (issue 17 item 1).

Every healthy GPU of every model is placeable: a job asking for the minority model starts, the
whole-GPU jobs fill every card of the node, and a model a node has only one of is used. Jobs ask
for 0.1 CPU so that a small test machine's CPUs (the simulated node reports the host's) are not
what limits them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.pool import Pool, wait_for


def _pool(root: Path, spec: str) -> Iterator[Pool]:
    p = Pool(root)
    try:
        p.start_server()
        p.start_agent("mix", spec)
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def mixed_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The README's example: one node with two A100s and two T4s."""
    yield from _pool(tmp_path_factory.mktemp("mixed"), "2xA100-80GB,2xT4")


@pytest.fixture
def t4_h100_pool(tmp_path: Path) -> Iterator[Pool]:
    yield from _pool(tmp_path, "2xT4,1xH100-80GB")


def _models_of(pool: Pool, job_id: str) -> list[str]:
    devices = {d["uuid"]: d["model"] for d in pool.get("/v1/devices")}
    return [devices[s["device_uuid"]] for s in pool.job(job_id)["slices"]]


def _finish(pool: Pool, *names: str) -> None:
    for name in names:
        (pool.out / f"{name}.go").write_text("")


def test_a_t4_job_on_an_a100_and_t4_node_starts_on_a_t4(mixed_pool: Pool) -> None:
    pool = mixed_pool
    job_id = pool.submit("t4-only", "wait", resources={"gpus": "1", "gpu_types": ["T4"]})
    try:
        pool.wait_state(job_id, "RUNNING")
        assert [m for m in _models_of(pool, job_id) if "T4" in m] == _models_of(pool, job_id)
    finally:
        _finish(pool, "t4-only")
    pool.wait_state(job_id, "COMPLETED")


def test_whole_gpu_jobs_fill_every_card_of_a_mixed_node(mixed_pool: Pool) -> None:
    pool = mixed_pool
    names = [f"whole{i}" for i in range(4)]
    jobs = [pool.submit(n, "wait", resources={"gpus": "1", "cpus": "0.1"}) for n in names]
    try:
        for job_id in jobs:
            pool.wait_state(job_id, "RUNNING")
        models = sorted(m for j in jobs for m in _models_of(pool, j))
        assert len(models) == 4
        assert sum("T4" in m for m in models) == 2, models
        assert sum("A100" in m for m in models) == 2, models
    finally:
        _finish(pool, *names)
    for job_id in jobs:
        pool.wait_state(job_id, "COMPLETED")


def test_the_single_h100_of_a_t4_node_takes_an_h100_job(t4_h100_pool: Pool) -> None:
    pool = t4_h100_pool
    job_id = pool.submit("h100", "wait", resources={"gpus": "1", "gpu_types": ["H100"]})
    try:
        pool.wait_state(job_id, "RUNNING")
        assert ["H100" in m for m in _models_of(pool, job_id)] == [True]
    finally:
        _finish(pool, "h100")
    pool.wait_state(job_id, "COMPLETED")


def test_a_two_gpu_replica_on_a_mixed_node_gets_two_cards_of_one_model(mixed_pool: Pool) -> None:
    pool = mixed_pool
    jobs = {n: pool.submit(n, "wait", resources={"gpus": "2", "cpus": "0.1"}) for n in ("pa", "pb")}
    try:
        for job_id in jobs.values():
            pool.wait_state(job_id, "RUNNING")
        for job_id in jobs.values():
            models = _models_of(pool, job_id)
            assert len(models) == 2
            assert len(set(models)) == 1, models
    finally:
        _finish(pool, *jobs)
    for job_id in jobs.values():
        pool.wait_state(job_id, "COMPLETED")
    wait_for(lambda: all(not pool.job(j)["slices"] for j in jobs.values()), 30, "slices freed")
