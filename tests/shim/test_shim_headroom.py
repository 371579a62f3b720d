"""Context headroom when packing (issue 25, finding 6): a real server and a real agent whose
simulated GPU says what a process holds beyond its slice (``context_reserve`` in its spec, as a
real agent measures it), and whose node offers the shim (the fake driver stands in for the
real one, as in ``test_shim_pool``).

One 80 GiB A100 (81,920 MiB) with a 1,000 MiB reserve. Four replicas of a quarter GPU with
20,000 MiB each promise 80,000 MiB: they fit the card only if nobody counts the contexts.
Under isolation ``soft`` each context lies outside its slice, so the fourth would overrun the
card by the contexts (4 x 21,000 MiB > 81,920 MiB): it stays pending and says why. Under
``shim`` (and ``auto``, which picks the shim on this node) the context is charged inside the
slice, so all four start, as before. (The jobs are plain Python programs that never attach to
their region, so the node later reports them as running without the shim; what is tested
here is where the scheduler puts them.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.pool import Pool, wait_for
from tests.shim.helpers import Natives
from tests.shim.test_shim_pool import ShimPool

RESERVE_MIB = 1000
QUARTER = {"gpus": "0.25", "gpu_memory": "20000MiB", "cpus": "0.1"}
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def reserve_pool(natives: Natives, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    root = tmp_path_factory.mktemp("headroom")
    spec = root / "gpus.yaml"
    spec.write_text(
        f"devices:\n  - {{model: A100-80GB, count: 1, context_reserve: {RESERVE_MIB}MiB}}\n"
    )
    p = ShimPool(root, natives)
    try:
        p.start_server()
        p.start_agent("n1", str(spec))
        yield p
    finally:
        p.close()


def _submit_four(pool: Pool, prefix: str, isolation: str) -> list[str]:
    return [
        pool.submit(f"{prefix}{i}", "wait", resources=QUARTER, isolation=isolation)
        for i in range(4)
    ]


def _finish(pool: Pool, jobs: list[str], prefix: str) -> None:
    for i in range(len(jobs)):
        (pool.out / f"{prefix}{i}.go").write_text("")
    for job_id in jobs:
        pool.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=DEADLINE_S)


def test_the_node_reports_its_reserve_and_offers_the_shim(reserve_pool: Pool) -> None:
    node = reserve_pool.node("n1")
    assert node is not None
    assert "shim" in node["isolation_modes"]


def test_soft_replicas_keep_a_context_of_headroom_each_so_the_last_stays_pending(
    reserve_pool: Pool,
) -> None:
    pool = reserve_pool
    jobs = _submit_four(pool, "soft", "soft")
    try:
        for job_id in jobs[:3]:
            pool.wait_state(job_id, "RUNNING", timeout=DEADLINE_S)

        def told() -> dict[str, Any] | None:
            j = pool.job(jobs[3])
            return j if j["state"] == "PENDING" and j.get("pending_reason") else None

        try:
            last = wait_for(told, DEADLINE_S, "the fourth soft job's pending reason")
        except AssertionError as exc:
            seen = [
                {k: pool.job(j).get(k) for k in ("state", "pending_reason", "reason", "slices")}
                for j in jobs
            ]
            raise AssertionError(f"{exc}: the four jobs are {seen}") from None
        said = last["pending_reason"]
        assert said.startswith("InsufficientMemory: "), said
        assert "CUDA context" in said, said
        assert "overrun the card" in said, said
        assert f"{RESERVE_MIB}MiB per replica" in said, said  # the node's figure, not a default
        assert "isolation shim" in said, said
        # It stays pending while the three run (a later cycle does not squeeze it in).
        assert pool.job(jobs[3])["state"] == "PENDING"
        assert not pool.job(jobs[3])["slices"]
    finally:
        _finish(pool, jobs, "soft")


@pytest.mark.parametrize("isolation", ["shim", "auto"])
def test_shim_replicas_count_the_context_inside_the_slice_so_all_four_start(
    reserve_pool: Pool, isolation: str
) -> None:
    pool = reserve_pool
    prefix = f"{isolation}-"
    jobs = _submit_four(pool, prefix, isolation)
    try:
        for job_id in jobs:
            pool.wait_state(job_id, "RUNNING", timeout=DEADLINE_S)
        slices = [s for j in jobs for s in pool.job(j)["slices"]]
        assert len({s["device_uuid"] for s in slices}) == 1, slices  # all four on the one card
        assert sorted(s["memory_mib"] for s in slices) == [20000] * 4, slices
    finally:
        _finish(pool, jobs, prefix)
