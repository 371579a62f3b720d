"""The default CPU of a job is its GPU share of the node's CPUs, not one CPU.

A 2-core workstation with four (simulated) GPUs ran two half-GPU jobs at a time: each job
without ``-c`` took one whole CPU, so the CPUs ran out with six of eight half GPUs free. Now a
job that names no CPUs gets its GPU share of the CPUs per GPU of its pool
(:func:`gpupool.domain.resources.default_cpu_milli`): eight half-GPU jobs fill four GPUs.
A job that names its CPUs still gets exactly those.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.client import Client
from gpupool.domain.resources import (
    FALLBACK_CPU_PER_GPU_MILLI,
    ResourceRequest,
    cpu_per_gpu_by_pool,
    default_cpu_milli,
    with_default_cpu,
)
from tests.cli.conftest import LocalPool
from tests.readiness import wait_ready

GPUS = 4


@pytest.fixture
def workstation(tmp_path: Path) -> Iterator[LocalPool]:
    """A pool of one node with four GPUs and this machine's CPUs."""
    pool = LocalPool(tmp_path)
    try:
        pool.start_server()
        pool.start_agent("ws", f"{GPUS}xA100-80GB")
        yield pool
    finally:
        pool.close()


def _submit(pool: LocalPool, *args: str) -> str:
    env = {"GPUPOOL_SERVER": pool.url, "GPUPOOL_TOKEN": pool.admin_token}
    r = CliRunner().invoke(app, ["submit", "--parsable", *args], env=env)
    assert r.exit_code == 0, r.output
    return r.stdout.strip()


def test_half_gpu_jobs_fill_every_gpu_of_a_small_workstation(workstation: LocalPool) -> None:
    node_cpus = workstation.node("ws")["cpu_milli"]  # type: ignore[index]
    jobs = 2 * GPUS
    if node_cpus >= jobs * 1000:
        pytest.skip(f"this machine has {node_cpus // 1000} CPUs: one CPU per job fits anyway")
    ids = [
        _submit(workstation, "-J", f"half-{i}", "-g", "0.5", "--", "sleep", "600")
        for i in range(jobs)
    ]
    with Client(workstation.url, workstation.admin_token) as gp:
        try:
            wait_ready(
                lambda: all(gp.get(i).state == "RUNNING" for i in ids),
                what=f"{jobs} half-GPU jobs running on {GPUS} GPUs",
            )
        finally:
            for job_id in ids:
                gp.cancel(job_id)


def test_the_default_cpu_rule() -> None:
    # 2 CPUs over 4 GPUs: half a GPU gets a quarter of a CPU, a whole GPU half of one.
    per_gpu = cpu_per_gpu_by_pool({"ws": 2000}, [("ws", "default")] * 4)
    assert per_gpu == {"default": 500}
    assert default_cpu_milli(500, per_gpu["default"]) == 250
    assert default_cpu_milli(2000, per_gpu["default"]) == 1000
    assert default_cpu_milli(0, per_gpu["default"]) == 1000  # CPU only: one CPU
    assert default_cpu_milli(500, None) == 500 * FALLBACK_CPU_PER_GPU_MILLI // 1000
    # The tightest node of a pool sets its ratio; a node's GPUs count whatever their pool.
    mixed = cpu_per_gpu_by_pool(
        {"big": 64000, "small": 8000},
        [("big", "default")] * 8 + [("small", "default")] * 2 + [("small", "batch")] * 2,
    )
    assert mixed == {"default": 2000, "batch": 2000}
    asked = ResourceRequest(gpu_milli=500, cpu_milli=4000)
    assert with_default_cpu(asked, 500) is asked
    auto = ResourceRequest(gpu_milli=500, cpu_auto=True)
    assert with_default_cpu(auto, 500).cpu_milli == 250


def test_a_job_file_without_cpus_is_marked_for_the_rule() -> None:
    from gpupool.domain.jobspec import build_spec

    assert build_spec({"name": "a", "command": ["x"]}).resources.cpu_auto
    named = build_spec({"name": "a", "command": ["x"], "resources": {"cpus": 2}}).resources
    assert (named.cpu_auto, named.cpu_milli) == (False, 2000)
