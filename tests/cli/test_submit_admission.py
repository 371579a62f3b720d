"""`gpupool submit` / `run` of what no node of the pool could ever hold (issue 17 item 6): refused
at once, like sbatch's "Requested node configuration is not available", with the limit that
fails and how to queue it anyway; nothing is stored. The live pool has one node with two
A100-80GB cards and one T4 (tests/cli/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpupool.client import Client
from gpupool.client.errors import ApiError
from gpupool.domain.states import JobState
from tests.cli.conftest import LocalPool, Result

Cli = Callable[..., Result]


def _error(r: Result) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def _job_count(pool: LocalPool) -> int:
    with Client(pool.url, pool.admin_token, home=pool.home) as gp:
        return len(gp.list(limit=100_000))


@pytest.mark.parametrize(
    ("options", "says", "not_says"),
    [
        (["-g", "1", "--gpu-mem", "100GiB"], ["100GiB", "80GiB", "A100"], ["CPUs per"]),
        (["-g", "4"], ["4 GPUs per replica", "at most 2 of one model"], ["memory"]),
        (["-g", "2", "--gpu-type", "T4"], ["2 GPUs per replica", "at most 1 of one model"], []),
        (["-g", "1", "--gpu-type", "H100"], ["no node of pool default has a GPU of type H100"], []),
        (["-g", "0.5", "-c", "4000"], ["4000 CPUs per replica"], ["GPU memory"]),
        (["-g", "0.5", "--mem", "60TiB"], ["60TiB of host memory"], []),
        (["-g", "2", "--replicas", "2"], ["the 2 replicas of this gang", "at most 1"], []),
    ],
)
def test_submit_of_what_no_node_could_hold_is_refused_naming_the_limit(
    pool_env: LocalPool, cli: Cli, options: list[str], says: list[str], not_says: list[str]
) -> None:
    before = _job_count(pool_env)
    message = _error(cli("submit", "-J", "impossible", *options, "--", "true"))
    for text in says:
        assert text in message, message
    for text in not_says:
        assert text not in message, message
    assert "--queue-anyway" in message
    assert _job_count(pool_env) == before  # nothing stored


def test_run_of_what_no_node_could_hold_fails_at_once_instead_of_waiting(
    pool_env: LocalPool, cli: Cli
) -> None:
    message = _error(cli("run", "-g", "1", "--gpu-mem", "100GiB", "--", "true"))
    assert "80GiB" in message


def test_submit_queue_anyway_stores_it_pending_for_nodes_yet_to_join(
    pool_env: LocalPool, cli: Cli
) -> None:
    r = cli(
        "submit", "--queue-anyway", "--parsable", "-g", "1", "--gpu-mem", "100GiB", "--", "true"
    )
    assert r.exit_code == 0, r.stderr
    job_id = r.stdout.strip()
    with Client(pool_env.url, pool_env.admin_token, home=pool_env.home) as gp:
        for _ in range(300):
            if gp.get(job_id).pending_reason:
                break
            gp.clock.sleep(0.1)
        job = gp.get(job_id)
        assert job.state == JobState.PENDING.value
        assert (job.pending_reason or "").startswith("TooLarge"), job.pending_reason
        gp.cancel(job_id)


def test_the_sdk_refuses_and_queues_anyway_the_same(pool_env: LocalPool) -> None:
    with Client(pool_env.url, pool_env.admin_token, home=pool_env.home) as gp:
        with pytest.raises(ApiError, match="a GPU of type H100"):
            gp.submit(name="h", command=["true"], gpus="1", gpu_types=["H100"])
        job = gp.submit(name="h", command=["true"], gpus="1", gpu_types=["H100"], queue_anyway=True)
        assert job.state == JobState.PENDING.value
        gp.cancel(job.id)
