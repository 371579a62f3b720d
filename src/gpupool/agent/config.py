"""How one agent runs: :class:`AgentConfig`, the settings ``gpupool agent`` and ``gpupool up``
give it (from their flags), with their units and defaults.

Its own module so that what only needs the settings (the agent's mixins, the CLI) need not
import the agent itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpupool.agent.runas import AGENT


@dataclass
class AgentConfig:
    """How one agent runs. Times in seconds; ``None`` fields take a default at start."""

    node: str
    state_dir: Path
    address: str | None = None
    checkpoint_root: Path | None = None  # default <state>/checkpoints
    pool: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)  # --feature, for --constraint
    heartbeat_interval_s: float = 5.0  # until the server says otherwise
    local_tick_s: float = 0.25
    log_ship_interval_s: float = 1.0  # how often new log bytes go to the server
    log_cap_bytes: int = 64 * 1024 * 1024
    watchdog_grace_s: float = 30.0
    pressure_threshold: float = 0.95
    use_mps: bool = True
    #: How long an ended job's processes may stay listed by NVML (the driver tearing their
    #: contexts down) before its slices are given back anyway and its devices marked unhealthy.
    release_wait_s: float = 30.0
    #: A shim replica none of whose processes attached to its region is reported as running
    #: without the shim this long after NVML first listed its processes on the GPU, or after
    #: ``shim_attach_deadline_s`` of running in any case.
    shim_attach_wait_s: float = 10.0
    shim_attach_deadline_s: float = 120.0
    #: Measure the CUDA context size of each GPU model at start (NVML backend only).
    measure_context: bool = True
    run_as: str = AGENT  # SUBMITTER, or one account's name: who jobs run as (agent/runas.py)
