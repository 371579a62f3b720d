"""Nodes and devices as the control plane knows them.

- **device**: one physical GPU, or one MIG instance, addressed by its UUID. Memory in MiB.
- **node**: a machine that runs one agent and owns devices.
- **NVLink group**: devices on one node joined by NVLink share a group id; placement prefers
  keeping a multi-GPU job inside one group. ``None`` means "no NVLink information".
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class DeviceHealth(enum.Enum):
    """Whether the scheduler may place work on a device."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # lost from NVML, fatal XID, or over its temperature limit
    UNKNOWN = "unknown"  # not heard from recently


class NodeState(enum.Enum):
    """A node's state as the control plane sees it (Slurm-like names)."""

    UP = "up"
    DRAINING = "draining"  # running jobs finish, nothing new is placed
    DRAINED = "drained"
    DOWN = "down"  # missed heartbeats past its timeout


@dataclass(frozen=True)
class Device:
    """One schedulable GPU (or MIG instance).

    ``compute_capability`` is ``(major, minor)`` or ``None`` when unknown; ``mig_parent`` is the
    UUID of the physical GPU for a MIG instance and ``None`` for a whole GPU; ``mig_profile`` is
    the instance profile (``1g.10gb``) or ``None``. ``context_reserve_mib`` is what one process
    holds on the device beyond the memory its framework allocates (its CUDA context, module
    images, library workspaces), as the node measured it; ``None`` where the node did not say (an
    agent older than the field): the scheduler then assumes
    :data:`~gpupool.scheduling.layout.DEFAULT_CONTEXT_RESERVE_MIB`.
    """

    uuid: str
    node: str
    index: int
    model: str
    memory_mib: int
    pool: str = "default"
    compute_capability: tuple[int, int] | None = None
    nvlink_group: int | None = None
    mig_parent: str | None = None
    mig_profile: str | None = None
    health: DeviceHealth = DeviceHealth.HEALTHY
    context_reserve_mib: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_parent is not None


@dataclass(frozen=True)
class Node:
    """One agent's machine. CPU in milli-CPU, host memory in MiB.

    ``isolation_modes`` are the modes its agent offers (its registration), ``None`` for a node
    that never registered one (a simulated cluster, a test).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    state: NodeState = NodeState.UP
    labels: tuple[tuple[str, str], ...] = ()
    isolation_modes: tuple[str, ...] | None = None
    features: tuple[str, ...] = ()  # for --constraint (gpupool agent --feature), sorted

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.UP


_TOKEN_RE = re.compile(r"[a-z0-9]+")


def gpu_type_words(text: str) -> set[str]:
    """The words a GPU type or model is matched by (lower case letters and digits)."""
    return set(_TOKEN_RE.findall(text.lower()))


_tokens = gpu_type_words


def matches_gpu_type(model: str, wanted: str) -> bool:
    """True when a device model satisfies a requested GPU type.

    Every word of ``wanted`` must be a word of ``model``, case-insensitively, so ``A100`` matches
    ``NVIDIA A100-SXM4-80GB`` and ``A100-80GB`` matches it too, but ``A10`` does not match ``A100``.
    """
    wanted_tokens = _tokens(wanted)
    return bool(wanted_tokens) and wanted_tokens <= _tokens(model)


def is_mig_model(model: str) -> bool:
    """True for a MIG instance's model (``MIG 1g.18gb``, as the agent registers it)."""
    return model == "MIG" or model.startswith("MIG ")


def allowed_model(model: str, gpu_types: tuple[str, ...]) -> bool:
    """True when ``model`` is acceptable for a request listing ``gpu_types`` (empty = any)."""
    return not gpu_types or any(matches_gpu_type(model, t) for t in gpu_types)
