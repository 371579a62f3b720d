"""Isolation modes: how a node enforces a slice, and which one a job gets.

Each mode is a small object registered by name in :data:`MODES` (no ``if mode == ...``
chains). For one replica's slice (:class:`SliceContext`) a mode says whether it can enforce it
(:meth:`IsolationMode.supports`) and which environment the job's processes need
(:meth:`IsolationMode.job_env`).

| mode | guarantees | needs |
|---|---|---|
| ``mig`` | hardware partition: own SMs, memory and cache | devices that are MIG instances |
| ``exclusive`` | whole devices, nobody else on them | a whole-device slice |
| ``mps`` | hard SM share and pinned memory limit (NVIDIA MPS) | a running MPS control daemon |
| ``mps+shim`` | MPS's SM share, the shim's memory limit per replica | both of the above |
| ``shim`` | any CUDA program held to the slice's memory and SM share | a driver, a C compiler |
| ``soft`` | framework memory caps + NVML watchdog | nothing (best effort) |

``auto`` walks :data:`AUTO_ORDER`, strongest first, and takes the first mode that supports the
slice: a fractional slice gets ``mps+shim`` where the node runs MPS and can run the shim, else
``mps``, else ``shim``, else ``soft``. Under ``mps+shim`` MPS's active-thread percentage does
the compute share (the shim's pacing is off: the region's share is 1000) and the shim holds each
replica to its own memory limit: MPS's pinned-memory limit is per MPS server, that is per Unix
user, so it cannot tell two replicas of one user apart.
An explicitly requested mode that cannot be enforced is refused with a reason (the job
then fails to boot with that reason) rather than silently weakened.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Protocol

from gpupool.domain.errors import GpupoolError
from gpupool.runtime.shim import ShimIsolation
from gpupool.runtime.slicectx import SliceContext, SliceDevice

__all__ = ["SliceContext", "SliceDevice"]  # defined in slicectx (no import circle with shim)


class IsolationUnavailable(GpupoolError):
    """The requested isolation cannot be enforced for this slice on this node."""


class IsolationMode(Protocol):
    """One way to enforce a slice."""

    name: str

    def supports(self, ctx: SliceContext) -> str | None:
        """``None`` when this mode can enforce ``ctx``; otherwise why not (for people)."""
        ...

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        """Environment variables the job's processes need under this mode."""
        ...


class Mig:
    name = "mig"

    def supports(self, ctx: SliceContext) -> str | None:
        if ctx.devices and all(d.is_mig for d in ctx.devices):
            return None
        return "the slice's devices are not MIG instances"

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        return {}  # CUDA_VISIBLE_DEVICES with MIG UUIDs is all it takes


class Exclusive:
    name = "exclusive"

    def supports(self, ctx: SliceContext) -> str | None:
        if ctx.whole:
            return None
        return f"the slice is a fraction ({ctx.milli}m) of a device, not whole devices"

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        return {}


def mps_thread_percentage(milli: int) -> int:
    """MPS active-thread percentage for a compute share: rounded up, 1..100."""
    return max(1, min(100, math.ceil(milli / 10)))


class Mps:
    name = "mps"

    def supports(self, ctx: SliceContext) -> str | None:
        if ctx.mps_pipe_dir is None:
            return "this node runs no MPS control daemon (nvidia-cuda-mps-control not available)"
        if any(d.is_mig for d in ctx.devices):
            return "MPS on MIG instances is not supported by gpupool"
        return ctx.mps_refused

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        assert ctx.mps_pipe_dir is not None
        # Keyed by UUID: an ordinal would be read relative to CUDA_VISIBLE_DEVICES by the
        # client, and name another GPU for anyone else. The agent sets the same limits on the
        # user's MPS server, so a job exporting larger values gets nothing more.
        limits = ",".join(f"{d.uuid}={ctx.memory_mib}M" for d in ctx.devices)
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": ctx.mps_pipe_dir,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(mps_thread_percentage(ctx.milli)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limits,
            **framework_caps(ctx, hard=True),
        }
        if ctx.mps_log_dir is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = ctx.mps_log_dir
        return env


def memory_fraction(ctx: SliceContext) -> float:
    """The slice's memory as a fraction of the smallest device, floored to 3 decimals."""
    smallest = min((d.memory_mib for d in ctx.devices), default=0)
    if smallest <= 0:
        return 1.0
    return max(0.001, min(1.0, math.floor(ctx.memory_mib / smallest * 1000) / 1000))


def framework_caps(ctx: SliceContext, *, hard: bool) -> dict[str, str]:
    """What makes frameworks that size memory from the physical total start inside a slice.

    PyTorch gets a memory fraction through the start hook, JAX ``XLA_PYTHON_CLIENT_MEM_FRACTION``
    (it preallocates that fraction of the whole GPU); vLLM's ``--gpu-memory-utilization`` takes
    ``GPUPOOL_MEMORY_FRACTION``. Under a hard limit (MPS) the CUDA context must fit in the
    slice too, so the fraction leaves the context reserve out; under soft isolation the
    watchdog allows the reserve on top instead.
    """
    memory = ctx.memory_mib - ctx.reserve_mib if hard else ctx.memory_mib
    if hard and memory < ctx.memory_mib // 2:
        memory = ctx.memory_mib // 2  # a tiny slice: the context cannot be left out entirely
    fraction = f"{memory_fraction(dataclasses.replace(ctx, memory_mib=memory)):.3f}"
    env = {
        "GPUPOOL_MEMORY_FRACTION": fraction,
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    if ctx.soft_hook_dir is not None:
        env["PYTHONPATH"] = ctx.soft_hook_dir  # prepended to the job's own PYTHONPATH
    return env


def shim_framework_caps(ctx: SliceContext) -> dict[str, str]:
    """Framework fractions for a job whose driver is the shim's: fractions of the *slice*.

    The shim reports the slice as each device's total (``cuMemGetInfo``, NVML), so a fraction
    of the physical device would cut the slice a second time (a 35,000 MiB slice of an H200
    left PyTorch about 8,400 MiB). What a process can reach is the slice less the context
    reserve the shim charges it (the agent's measurement, else the model's estimate).
    """
    measured = [ctx.shim_reserve_bytes.get(d.uuid, 0) for d in ctx.devices]
    reserve = max(measured, default=0) // (1 << 20) or ctx.reserve_mib

    def total(d: SliceDevice) -> int:  # what cuMemGetInfo reports there
        return ctx.memory_mib if ctx.spill else min(d.memory_mib, ctx.memory_mib)

    seen = tuple(dataclasses.replace(d, memory_mib=total(d)) for d in ctx.devices)
    return framework_caps(dataclasses.replace(ctx, devices=seen, reserve_mib=reserve), hard=True)


class MpsShim:
    """MPS for compute, the CUDA shim for each replica's memory limit (pacing off)."""

    name = "mps+shim"

    def supports(self, ctx: SliceContext) -> str | None:
        return Mps().supports(ctx) or ShimIsolation().supports(ctx)

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        env = Mps().job_env(ctx)
        env.update(shim_framework_caps(ctx))  # the slice is the total the job sees
        env.update(ShimIsolation().job_env(ctx, pace=False))
        return env


#: Modes under which MPS serves the replica, and those under which the shim holds it.
MPS_MODES = frozenset({"mps", "mps+shim"})
SHIM_MODES = frozenset({"shim", "mps+shim"})


class Soft:
    name = "soft"

    def supports(self, ctx: SliceContext) -> str | None:
        return None

    def job_env(self, ctx: SliceContext) -> dict[str, str]:
        return framework_caps(ctx, hard=False)


#: Every mode by name. A new mode is one more entry at the end.
MODES: dict[str, IsolationMode] = {
    m.name: m
    for m in (
        Mig(),
        Exclusive(),
        Mps(),
        Soft(),
        ShimIsolation(),
        MpsShim(),
    )
}
#: The order ``auto`` tries, strongest guarantee first.
AUTO_ORDER: tuple[str, ...] = ("mig", "exclusive", "mps+shim", "mps", "shim", "soft")


def resolve(requested: str, ctx: SliceContext) -> str | None:
    """The mode a replica gets: ``None`` for a CPU-only replica (no devices).

    Raises :class:`IsolationUnavailable` when an explicitly requested mode cannot be enforced.
    """
    if not ctx.devices:
        return None
    if requested == "auto":
        for name in AUTO_ORDER:
            if MODES[name].supports(ctx) is None:
                return name
        raise IsolationUnavailable("no isolation mode can enforce this slice")  # pragma: no cover
    mode = MODES.get(requested)
    if mode is None:
        known = ", ".join(["auto", *MODES])
        raise IsolationUnavailable(f"unknown isolation mode {requested!r}: use one of {known}")
    why = mode.supports(ctx)
    if why is not None:
        raise IsolationUnavailable(
            f"isolation {requested} was requested but {why}: submit with isolation auto"
        )
    return requested


def isolation_env(mode: str | None, ctx: SliceContext) -> Mapping[str, str]:
    """The environment for ``mode`` (empty for CPU-only replicas)."""
    return {} if mode is None else MODES[mode].job_env(ctx)


def offered_modes(*, mps: bool, mig: bool, shim: bool = False) -> list[str]:
    """Modes a node offers, for its registration."""
    have = {"mps": mps, "mig": mig, "shim": shim, "mps+shim": mps and shim}
    return [m for m in AUTO_ORDER if have.get(m, True)]
