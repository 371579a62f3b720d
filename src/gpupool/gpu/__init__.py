"""GPU backends behind one protocol: NVML (nvidia-ml-py) and simulated devices.

:func:`open_backend` is how the agent gets one: ``simulate`` set -> simulated devices from that
spec; otherwise NVML, which raises :class:`~gpupool.gpu.base.GpuUnavailable` (one clear line)
when no driver is present, unless ``fallback`` names a spec to simulate instead (standalone mode).
"""

from __future__ import annotations

from gpupool.gpu.base import GpuBackend, GpuUnavailable


def open_backend(
    *,
    node: str,
    simulate: str | None = None,
    seed: int = 0,
    fallback: str | None = None,
) -> GpuBackend:
    """The backend for this node (see the module docstring)."""
    from gpupool.gpu.simulated import SimulatedBackend

    if simulate:
        return SimulatedBackend.from_spec(simulate, node=node, seed=seed)
    from gpupool.gpu.nvml import NvmlBackend

    try:
        return NvmlBackend()
    except GpuUnavailable:
        if fallback is None:
            raise
        return SimulatedBackend.from_spec(fallback, node=node, seed=seed)


__all__ = ["GpuBackend", "GpuUnavailable", "open_backend"]
