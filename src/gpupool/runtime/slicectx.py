"""One replica's slice on a node, as the isolation modes see it.

Its own module so that :mod:`gpupool.runtime.isolation` (the registry of modes) and the modes it
registers (:mod:`gpupool.runtime.shim`) both import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.domain.units import MILLI_PER_GPU


@dataclass(frozen=True)
class SliceDevice:
    """A device of a slice: UUID, physical memory (MiB), and whether it is a MIG instance."""

    uuid: str
    memory_mib: int
    is_mig: bool = False


@dataclass(frozen=True)
class SliceContext:
    """One replica's slice on this node: its devices and the share of each.

    ``milli`` and ``memory_mib`` are per device. ``mps_pipe_dir`` / ``mps_log_dir`` are set
    when this node runs an MPS control daemon; ``mps_refused`` says why this replica may not
    use it all the same (another Unix user's MPS jobs on its GPU). ``soft_hook_dir`` is the
    folder holding the interpreter start hook. ``spill`` is the pool's memory oversubscription
    choice (the shim serves such allocations from host memory). ``reserve_mib`` is the CUDA
    context reserve of the devices' model (MiB a process holds beyond what its framework
    allocates). ``shim_reserve_bytes`` is, per device UUID, what a process's first context
    takes there as the agent measured it (:mod:`gpupool.runtime.shimreserve`): the shim
    charges it to the slice.
    """

    devices: tuple[SliceDevice, ...]
    milli: int
    memory_mib: int
    mps_pipe_dir: str | None = None
    mps_log_dir: str | None = None
    soft_hook_dir: str | None = None
    mps_refused: str | None = None
    reserve_mib: int = 0
    spill: bool = False  # an allocation that fits the slice but not the GPU goes to host memory
    shim_reserve_bytes: Mapping[str, int] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        return self.milli >= MILLI_PER_GPU
