"""The MPS control daemon: started and watched by the agent for ``mps`` isolation.

NVIDIA MPS lets several processes share one GPU with a hard share of its SMs
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and a pinned memory limit
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), both read by each client at CUDA start. The agent runs one
control daemon per node with its own pipe and log folders (under the agent's state folder), so
it does not disturb a system-wide daemon, and restarts it when a health probe fails.

For the strongest guarantee an admin also sets the GPUs to ``EXCLUSIVE_PROCESS`` compute mode
(``nvidia-smi -c EXCLUSIVE_PROCESS``), so that nothing bypasses MPS; gpupool does not change
device settings itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CONTROL_BINARY = "nvidia-cuda-mps-control"
_PROBE_TIMEOUT_S = 5.0


class MpsDaemon:
    """One MPS control daemon with private pipe and log folders."""

    def __init__(self, root: Path, binary: str = CONTROL_BINARY) -> None:
        self.pipe_dir = root / "pipe"
        self.log_dir = root / "log"
        self._binary = shutil.which(binary)
        self.restarts = 0

    @property
    def available(self) -> bool:
        """True when the control binary is installed."""
        return self._binary is not None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        return env

    def _control(self, command: str | None) -> bool:
        if self._binary is None:
            return False
        argv = [self._binary] if command is not None else [self._binary, "-d"]
        try:
            result = subprocess.run(
                argv,
                input=(command + "\n") if command is not None else None,
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def healthy(self) -> bool:
        """The daemon answers a ``get_server_list`` request."""
        return (self.pipe_dir / "control").exists() and self._control("get_server_list")

    def start(self) -> bool:
        """Start the daemon (``-d`` daemonises it); True when it answers afterwards."""
        if not self.available:
            return False
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.healthy():
            return True
        return self._control(None) and self.healthy()

    def ensure(self) -> bool:
        """Called periodically: restart the daemon if it stopped answering."""
        if self.healthy():
            return True
        self.restarts += 1
        return self.start()

    def stop(self) -> None:
        """Ask the daemon to quit (running clients keep their server until they exit)."""
        self._control("quit")
