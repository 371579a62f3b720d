"""Isolation modes, the soft start hook, the memory watchdog and the pressure rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.launch import SOFT_HOOK_DIR
from gpupool.runtime.isolation import (
    IsolationUnavailable,
    SliceContext,
    SliceDevice,
    isolation_env,
    memory_fraction,
    mps_thread_percentage,
    resolve,
)
from gpupool.runtime.watchdog import Action, MemoryWatchdog, WatchedReplica, pressure_victims

A100 = SliceDevice("GPU-a", 81920)
MIG = SliceDevice("MIG-m", 10240, is_mig=True)


def ctx(milli: int, mem: int, *devices: SliceDevice, mps: bool = False) -> SliceContext:
    return SliceContext(
        devices=devices or (A100,),
        milli=milli,
        memory_mib=mem,
        mps_pipe_dir="/run/mps" if mps else None,
        soft_hook_dir="/hook",
    )


def test_auto_picks_the_strongest_mode_available() -> None:
    assert resolve("auto", ctx(1000, 81920)) == "exclusive"
    assert resolve("auto", ctx(500, 40960)) == "soft"
    assert resolve("auto", ctx(500, 40960, mps=True)) == "mps"
    assert resolve("auto", ctx(1000, 10240, MIG)) == "mig"
    assert resolve("auto", SliceContext((), 0, 0)) is None  # CPU-only replica


def test_an_explicit_mode_that_cannot_be_enforced_is_refused_with_a_hint() -> None:
    with pytest.raises(IsolationUnavailable, match="isolation auto"):
        resolve("mps", ctx(500, 1000))
    with pytest.raises(IsolationUnavailable, match="fraction"):
        resolve("exclusive", ctx(500, 1000))
    with pytest.raises(IsolationUnavailable, match="unknown isolation"):
        resolve("magic", ctx(500, 1000))


def test_mps_env_has_the_thread_share_and_pinned_memory_per_device() -> None:
    c = ctx(250, 20480, A100, SliceDevice("GPU-b", 81920), mps=True)
    env = isolation_env("mps", c)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "GPU-a=20480M,GPU-b=20480M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"


@given(st.integers(1, 1000))
def test_mps_percentage_never_rounds_a_share_to_zero(milli: int) -> None:
    pct = mps_thread_percentage(milli)
    assert 1 <= pct <= 100
    assert pct * 10 >= milli


def test_soft_env_caps_frameworks_at_the_slice_fraction() -> None:
    env = isolation_env("soft", ctx(500, 20480))
    assert env["GPUPOOL_MEMORY_FRACTION"] == "0.250"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"
    assert env["PYTHONPATH"] == "/hook"
    assert memory_fraction(ctx(500, 100_000)) == 1.0


FAKE_TORCH = """
import json, os
calls = []
class _Cuda:
    _queued = []
    def _lazy_call(self, fn):
        self._queued.append(fn)
    def device_count(self):
        return 2
    def set_per_process_memory_fraction(self, fraction, device):
        calls.append([fraction, device])
    def init(self):  # what torch does on first CUDA use
        for fn in self._queued:
            fn()
cuda = _Cuda()
"""


def test_soft_hook_caps_torch_when_cuda_initialises(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{SOFT_HOOK_DIR}:{tmp_path}",
        "GPUPOOL_MEMORY_FRACTION": "0.25",
    }
    code = (
        "import torch\n"
        "assert torch.calls == [], 'no CUDA work at import'\n"
        "torch.cuda.init()\n"
        "print(torch.calls)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[[0.25, 0], [0.25, 1]]"


def test_soft_hook_runs_the_jobs_own_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.MINE = 42\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{SOFT_HOOK_DIR}:{tmp_path}"}
    out = subprocess.run(
        [sys.executable, "-c", "print(MINE)"], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "42"


def watched(key: str, used: int, **kw: object) -> WatchedReplica:
    base: dict[str, object] = {
        "device_uuids": ("GPU-a",),
        "memory_limit_mib": 1000,
        "usage_mib": {"GPU-a": used},
    }
    base.update(kw)
    return WatchedReplica(key=key, **base)  # type: ignore[arg-type]


def test_watchdog_signals_first_then_stops_after_the_grace() -> None:
    dog = MemoryWatchdog(grace_s=10, tolerance_mib=0)
    assert dog.check(0.0, [watched("j", 900)]) == []
    first = dog.check(1.0, [watched("j", 1500)])
    assert [v.action for v in first] == [Action.SIGNAL]
    assert "over its slice" in first[0].reason
    assert dog.check(5.0, [watched("j", 1500)]) == []
    stop = dog.check(11.0, [watched("j", 1500)])
    assert [v.action for v in stop] == [Action.STOP]


def test_watchdog_forgives_a_job_that_shrinks_and_ignores_hard_isolated_jobs() -> None:
    dog = MemoryWatchdog(grace_s=10, tolerance_mib=0)
    dog.check(0.0, [watched("j", 1500)])
    dog.check(5.0, [watched("j", 800)])  # back under: reset
    assert [v.action for v in dog.check(12.0, [watched("j", 1500)])] == [Action.SIGNAL]
    assert dog.check(0.0, [watched("m", 5000, watched=False)]) == []


def test_pressure_stops_the_lowest_priority_opportunistic_job_once() -> None:
    replicas = [
        watched("high", 30000, priority=900, preemptible=True),
        watched("low", 30000, priority=100, preemptible=True),
        watched("guaranteed", 19000, priority=50, preemptible=False),
    ]
    verdicts = pressure_victims({"GPU-a": (79000, 81920)}, replicas)
    assert [(v.key, v.action) for v in verdicts] == [("low", Action.STOP)]
    assert "memory pressure on GPU-a" in verdicts[0].reason
    # while that victim is still stopping, nobody else is chosen on the device
    assert pressure_victims({"GPU-a": (79000, 81920)}, replicas, 0.95, frozenset({"low"})) == []
    # no pressure, no victim
    assert pressure_victims({"GPU-a": (40000, 81920)}, replicas) == []
