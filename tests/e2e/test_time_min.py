"""``--time-min`` through a real scheduler cycle (server + agent, CLI submits).

A node with two GPUs: job ``a`` holds one for up to 10 minutes; ``big`` (high priority) needs
both, so the scheduler reserves the node for it at ``a``'s end. Two one-GPU jobs with a 30
minute limit come after it: ``plain`` would run past the reserved start and waits
(``WaitingForReservation``); ``short`` has ``--time-min 5``, so backfill starts it at once with
the longest limit that ends before the reserved start (between 5 and 10 minutes), and its time
limit is that from then on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.clirun import gpupool
from tests.e2e.pool import Pool, wait_for


@pytest.fixture(scope="module")
def tpool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    with Pool.running(tmp_path_factory.mktemp("timemin"), {"n1": "2xA100-80GB"}) as p:
        yield p


def submit(pool: Pool, *args: str) -> str:
    done = gpupool(pool, "submit", "--parsable", *args, "--", "sleep", "3600")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_only_a_job_with_time_min_backfills_into_the_gap(tpool: Pool) -> None:
    ids = []
    try:
        a = submit(tpool, "-J", "a", "-g", "1", "-t", "10")
        ids.append(a)
        tpool.wait_state(a, "RUNNING")
        big = submit(tpool, "-J", "big", "-g", "2", "-t", "60", "-q", "high")
        ids.append(big)
        plain = submit(tpool, "-J", "plain", "-g", "1", "-t", "30")
        ids.append(plain)

        def reason_of(job_id: str) -> str | None:
            return tpool.job(job_id).get("pending_reason")

        said = wait_for(lambda: reason_of(plain), 60, "plain's pending reason")
        assert said.startswith("WaitingForReservation"), said
        short = submit(tpool, "-J", "short", "-g", "1", "-t", "30", "--time-min", "5")
        ids.append(short)
        started = tpool.wait_state(short, "CONFIGURING", "RUNNING")
        assert 300 <= started["time_limit_s"] <= 600, started["time_limit_s"]
        assert started["time_min_s"] == 300
        assert tpool.job(plain)["state"] == "PENDING"
        assert tpool.job(big)["state"] == "PENDING"
        events = tpool.get(f"/v1/jobs/{short}/events")
        assert any("--time-min backfill" in (e["reason"] or "") for e in events), events
    finally:
        for job_id in ids:
            tpool.post(f"/v1/jobs/{job_id}/cancel", {})


def test_time_min_needs_a_time_limit_at_least_as_long(tpool: Pool) -> None:
    done = gpupool(tpool, "submit", "--time-min", "10", "--", "true")
    assert done.returncode == 2
    assert "needs a time_limit" in done.stderr
    done = gpupool(tpool, "submit", "-t", "5", "--time-min", "10", "--", "true")
    assert done.returncode == 2
    assert "is longer than time_limit" in done.stderr
