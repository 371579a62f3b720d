"""``gpupool update JOB -g/--gpu-mem/--gpu-type/-c/--mem`` (scontrol update of a pending job's
resources, issue 27): checked as a submit is checked, refused for a running job with what to do
instead, audited; bad input changes nothing. Over the live pool of ``conftest.py`` (a server and
an agent with 2 x A100-80GB and 1 x T4), as a user runs the commands.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gpupool.client import Client
from gpupool.domain.states import JobState
from tests.cli.conftest import LocalPool, Result

Cli = Callable[..., Result]


def _client(pool: LocalPool) -> Client:
    return Client(pool.url, pool.admin_token)


def _resources(pool: LocalPool, job_id: str) -> tuple[object, ...]:
    with _client(pool) as gp:
        j = gp.get(job_id)
    return (j.gpu_milli, j.gpu_memory_mib, tuple(j.gpu_types), j.priority_class, j.time_limit_s)


def _error(r: Result) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_update_changes_a_pending_job_s_resources_and_audits_it(
    pool_env: LocalPool, cli: Cli
) -> None:
    job = cli("submit", "--parsable", "-H", "-J", "upd", "-g", "0.5", "--", "true").stdout.strip()
    r = cli("update", job, "-g", "2", "--gpu-mem", "40GiB", "--gpu-type", "A100", "--mem", "1GiB")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == (
        f"job {job} (upd): PENDING, priority normal, time limit none, GPU slice 2 40GiB A100"
    )
    assert _resources(pool_env, job)[:3] == (2000, 40960, ("A100",))
    # the keys not given stay: a new share keeps the job's GPU memory and model
    assert cli("update", job, "-g", "1").exit_code == 0
    assert _resources(pool_env, job)[:3] == (1000, 40960, ("A100",))
    shown = cli("show", job).stdout
    assert "GPU slice      1 40GiB A100" in shown
    with _client(pool_env) as gp:
        audited = gp.audit(action="job.update", target=job)
        gp.cancel(job)
    assert len(audited) == 2
    assert {a.actor for a in audited} == {"admin"}


def test_bad_or_impossible_resources_are_refused_and_change_nothing(
    pool_env: LocalPool, cli: Cli
) -> None:
    job = cli("submit", "--parsable", "-H", "-J", "upd-bad", "-g", "0.5", "--", "true").stdout
    job = job.strip()
    before = _resources(pool_env, job)
    cases = [
        (["-g", "0.5x"], "-g/--gpus: '0.5x' is not a GPU amount"),
        (["--mem", "lots"], "--mem: "),
        (["-g", "8"], "8 GPUs"),  # no node of the pool has 8 (the submit's own refusal)
        (["--gpu-mem", "100GiB"], "GPU memory"),  # more than any card
        (["--gpu-type", "H100"], "H100"),  # no such model in the pool
        (["-g", "0.5", "--gpu-mem", "10GiB", "-t", "soon"], "time_limit"),  # one bad: none
    ]
    for args, words in cases:
        r = cli("update", job, *args)
        assert r.exit_code == 2, (args, r.stdout, r.stderr)
        assert words in _error(r), (args, r.stderr)
        assert _resources(pool_env, job) == before, args
    # the API refuses a key that is not a resource, and a gpu memory with no GPU share
    headers = {"Authorization": f"Bearer {pool_env.admin_token}"}
    for body in ({"resources": {"replicas": 2}}, {"resources": {"gpus": 0, "gpu_memory": "1GiB"}}):
        answer = httpx.patch(f"{pool_env.url}/v1/jobs/{job}", json=body, headers=headers)
        assert answer.status_code == 422, answer.text
        assert _resources(pool_env, job) == before
    with _client(pool_env) as gp:
        assert gp.audit(action="job.update", target=job) == []
        gp.cancel(job)


def test_a_running_job_s_resources_are_refused_with_what_to_do(
    pool_env: LocalPool, cli: Cli
) -> None:
    job = cli("submit", "--parsable", "-J", "upd-run", "-g", "0.1", "--", "sleep", "60")
    job = job.stdout.strip()
    with _client(pool_env) as gp:
        gp.wait(job, timeout_s=120, poll_s=0.2, until=frozenset({JobState.RUNNING}))
        before = _resources(pool_env, job)
        r = cli("update", job, "-g", "0.5")
        assert r.exit_code == 6
        error = _error(r)
        assert "is RUNNING: only pending jobs can be updated" in error
        assert f"gpupool resize {job}" in error
        assert _resources(pool_env, job) == before
        gp.cancel(job)
