"""The isolation mode ``shim`` from the registry: resolved for a slice, its environment runs a
CUDA program under a region created before launch and sized from the slice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.runtime.isolation import (
    IsolationUnavailable,
    SliceContext,
    SliceDevice,
    isolation_env,
    resolve,
)
from gpupool.runtime.shim import Region, ShimIsolation
from tests.shim.conftest import MIB
from tests.shim.helpers import Probe, fake_uuid

OOM = 2


@pytest.fixture
def node(natives, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(natives.fake))
    monkeypatch.setenv("GPUPOOL_SHIM_DIR", str(natives.shim.root.parent))
    monkeypatch.setenv("GPUPOOL_SHIM_REGIONS", str(tmp_path / "regions"))
    return natives


def test_a_shim_slice_runs_a_cuda_program_held_to_its_memory(node, probes):
    ctx = SliceContext(devices=(SliceDevice(fake_uuid(0), 81920),), milli=250, memory_mib=20)
    assert resolve("shim", ctx) == "shim"
    env = dict(isolation_env("shim", ctx))
    region_path = Path(env["GPUPOOL_CUDA_REGION"])
    assert region_path.is_file()  # created before launch
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(node.shim.facade_dir)
    p = Probe(node.probe, {"PATH": os.environ["PATH"], **env})
    probes.append(p)
    p.ok("init")
    assert p.ok("info")[1] == str(20 * MIB)
    p.ok(f"alloc {20 * MIB}")
    assert p.err("alloc 1") == OOM
    with Region.open(region_path, build=node.shim) as region:
        snap = region.read()
        assert snap.attached_pids == (p.pid,)
        dev = snap.device(fake_uuid(0))
        assert (dev.used_bytes, dev.mem_limit_bytes, dev.sm_share_permille) == (
            20 * MIB,
            20 * MIB,
            250,
        )
    p.ok("exit")
    p.proc.wait()
    ShimIsolation.release(env)
    assert not region_path.exists()


def test_shim_is_refused_on_mig_and_without_a_driver(node, monkeypatch, tmp_path):
    mig = SliceContext(devices=(SliceDevice(fake_uuid(0), 10240, is_mig=True),), milli=1000,
                       memory_mib=10240)  # fmt: skip
    with pytest.raises(IsolationUnavailable, match="does not run on MIG instances"):
        resolve("shim", mig)
    monkeypatch.setenv("GPUPOOL_REAL_LIBCUDA", str(tmp_path / "missing" / "libcuda.so.1"))
    ctx = SliceContext(devices=(SliceDevice(fake_uuid(0), 81920),), milli=500, memory_mib=1024)
    with pytest.raises(IsolationUnavailable, match="set GPUPOOL_REAL_LIBCUDA to its path"):
        resolve("shim", ctx)


def test_a_shim_job_keeps_the_nodes_library_path_after_the_facade(node, monkeypatch):
    """agent/env.py puts the shim's façade folder in front of the job's own LD_LIBRARY_PATH (the
    node's, here different from the agent's own environment), never instead of it."""
    from gpupool.agent.env import job_env
    from gpupool.schemas.agent import AssignmentSpec

    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/agent-only")
    ctx = SliceContext(devices=(SliceDevice(fake_uuid(0), 81920),), milli=500, memory_mib=1024)
    ienv = isolation_env("shim", ctx)
    a = AssignmentSpec(assignment_id="a1", epoch=1, job_id="j1", job_name="t", replica_rank=0,
                       command=["true"], device_uuids=[fake_uuid(0)], milli_per_device=500,
                       memory_mib_per_device=1024)  # fmt: skip
    own = {"LD_LIBRARY_PATH": "/opt/job-libs:/opt/cuda"}
    env, _ = job_env(a, node="n1", checkpoint_dir="/tmp/ck", isolation="shim",
                     isolation_env=ienv, base_env=own)  # fmt: skip
    assert env["LD_LIBRARY_PATH"].split(":") == [
        str(node.shim.facade_dir),
        "/opt/job-libs",
        "/opt/cuda",
    ]
    ShimIsolation.release(ienv)
