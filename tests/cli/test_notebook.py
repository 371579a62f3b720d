"""``gpupool.allocate`` and the ``%gpupool`` magic against the live pool.

IPython is not installed here: the magic's work is plain methods on ``Magic``, and
``load_ipython_extension`` is exercised with a stand-in shell that records the registration.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest

import gpupool
from gpupool.client import Client, ClientError
from gpupool.client.ipython import Magic
from gpupool.domain.states import JobState
from tests.cli.conftest import LocalPool

pytestmark = pytest.mark.slow


@pytest.fixture
def gp(pool_env: LocalPool) -> Client:
    return Client(pool_env.url, pool_env.admin_token, home=pool_env.home)


def test_allocate_sets_cuda_devices_for_the_block_and_releases(
    gp: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "before")
    with gpupool.allocate(gpus=0.5, gpu_memory="10GiB", client=gp, hold="10m") as alloc:
        devices = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        assert len(devices) == 1
        assert devices[0].startswith("GPU-")
        assert os.environ["GPUPOOL_ALLOCATION"] == alloc.job_id
        job = gp.get(alloc.job_id)
        assert job.state == "RUNNING"
        assert (job.gpu_milli, job.gpu_memory_mib) == (500, 10240)
        assert job.command[0] == "sleep"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "before"
    assert "GPUPOOL_ALLOCATION" not in os.environ
    assert gp.wait(alloc.job_id, timeout_s=60, poll_s=0.2).state == "CANCELLED"


def test_allocate_refuses_once_cuda_started(gp: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    before = len(gp.list(name="interactive-admin"))
    with pytest.raises(ClientError, match="restart the kernel"), gpupool.allocate(0.5, client=gp):
        pass
    assert len(gp.list(name="interactive-admin")) == before  # nothing was submitted


def test_magic_alloc_status_release(gp: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    magic = Magic(client_factory=lambda: gp)
    shown = magic.run("alloc 0.25 5GiB hold=10m")
    assert "RUNNING" in shown
    assert "0.25 GPU, 5GiB" in shown
    assert "CUDA_VISIBLE_DEVICES=GPU-" in shown
    job_id = shown.split()[1]
    assert os.environ["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert "already holding" in magic.run("alloc 0.1")
    assert magic.run("status").startswith(f"job {job_id} RUNNING")
    assert magic.run("release") == f"released job {job_id}; CUDA_VISIBLE_DEVICES restored"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert magic.run("status").startswith("no allocation")
    assert JobState(gp.wait(job_id, timeout_s=60, poll_s=0.2).state) is JobState.CANCELLED
    assert magic.run("alloc 1.5").startswith("error: ")
    assert magic.run("frobnicate").startswith("error: unknown command 'frobnicate'")


def test_load_ext_registers_the_line_magic() -> None:
    registered: dict[str, Any] = {}

    class Shell:
        def __init__(self) -> None:
            self.user_ns: dict[str, Any] = {}

        def register_magic_function(self, fn: Any, magic_kind: str, magic_name: str) -> None:
            registered[magic_name] = (fn, magic_kind)

    shell = Shell()
    gpupool.load_ipython_extension(shell)
    fn, kind = registered["gpupool"]
    assert kind == "line"
    assert callable(fn)
    assert isinstance(shell.user_ns["_gpupool_magic"], Magic)
    gpupool.unload_ipython_extension(shell)
    assert "_gpupool_magic" not in shell.user_ns
