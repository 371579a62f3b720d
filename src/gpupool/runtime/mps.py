"""The MPS control daemon: started and watched by the agent for ``mps`` isolation.

NVIDIA MPS lets several processes share one GPU with a hard share of its SMs and a pinned
memory limit. The agent runs one control daemon per node with its own pipe and log folders
(under the agent's state folder), so it does not disturb a system-wide daemon, and restarts it
when a health probe fails.

How gpupool uses it, and why:

- **Limits on the server, not only in the job's environment.** A client reads
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at CUDA start,
  so a job could raise them by exporting its own values. The agent therefore also sets them on
  the MPS server of the job's Unix user (``set_active_thread_percentage`` and
  ``set_device_pinned_mem_limit``, after ``start_server -uid``): a client may lower its limits
  below the server's, never raise them. One server serves all MPS jobs of one user, so its
  limits are the largest slice that user holds (per device, by UUID); between users they hold
  exactly.
- **Device UUIDs, not ordinals**: an ordinal in a limit is relative to what the reader sees,
  which is not the same for the server and the client; UUIDs name one GPU everywhere.
- **One user at a time**: a server runs as one Unix user; a second user's client waits until
  the first user's clients are all gone. The agent never puts two users' jobs under MPS on one
  GPU (see ``agent.py``).
- **Silent fallback**: a client that cannot reach the daemon runs *without* MPS and without
  limits, and CUDA says nothing. The agent checks that each MPS job's GPU processes are in a
  server's client list (``get_client_list``) and reports the ones that are not.
- **Socket paths**: the daemon's sockets live in the pipe folder, and a Unix socket path has at
  most 107 bytes; a pipe folder too deep for that is replaced by a short one under ``/tmp``.

For the strongest guarantee an admin also sets the GPUs to ``EXCLUSIVE_PROCESS`` compute mode
(``nvidia-smi -c EXCLUSIVE_PROCESS``), so that nothing bypasses MPS; gpupool does not change
device settings itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

CONTROL_BINARY = "nvidia-cuda-mps-control"
PROBE_TIMEOUT_S = 5.0
#: Longest pipe folder whose sockets (``<pipe>/control``, server sockets beside it) still fit
#: in a Unix socket path (107 bytes), with room for the daemon's own socket names.
PIPE_DIR_MAX = 80

log = logging.getLogger("gpupool.runtime.mps")


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class MpsDaemon:
    """One MPS control daemon with private pipe and log folders."""

    def __init__(
        self, root: Path, binary: str = CONTROL_BINARY, timeout_s: float | None = None
    ) -> None:
        self.timeout_s = timeout_s  # for one control command; None: PROBE_TIMEOUT_S
        self.pipe_dir = root / "pipe"
        if len(str(self.pipe_dir)) > PIPE_DIR_MAX:
            digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
            short = Path("/tmp") / f"gpupool-mps-{digest}"
            log.info("MPS pipe folder %s is too long for a socket path: using %s", root, short)
            self.pipe_dir = short
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

    def _run(self, command: str | None) -> str | None:
        """A control command's output, or ``None`` when the daemon did not answer."""
        if self._binary is None:
            return None
        argv = [self._binary] if command is not None else [self._binary, "-d"]
        try:
            result = subprocess.run(
                argv,
                input=(command + "\n") if command is not None else None,
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=self.timeout_s or PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout if result.returncode == 0 else None

    def _control(self, command: str | None) -> bool:
        return self._run(command) is not None

    def healthy(self) -> bool:
        """The daemon answers a ``get_server_list`` request."""
        return (self.pipe_dir / "control").exists() and self._control("get_server_list")

    def start(self) -> bool:
        """Start the daemon (``-d`` daemonises it); True when it answers afterwards."""
        if not self.available:
            return False
        for folder in (self.pipe_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)  # clients of every job's account must reach the sockets
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

    # -- servers and their clients

    def servers(self) -> list[int]:
        """Pids of the MPS servers this daemon runs."""
        out = self._run("get_server_list") or ""
        return [int(w) for w in out.split() if w.isdigit()]

    def clients(self) -> set[int]:
        """Pids of every client attached to one of this daemon's servers."""
        found: set[int] = set()
        for server in self.servers():
            out = self._run(f"get_client_list {server}") or ""
            found.update(int(w) for w in out.split() if w.isdigit())
        return found

    def server_for(self, uid: int) -> int | None:
        """The pid of the server running as ``uid``, started if there is none."""
        for pid in self.servers():
            if _uid_of(pid) == uid:
                return pid
        if self._run(f"start_server -uid {uid}") is None:
            return None
        return next((p for p in self.servers() if _uid_of(p) == uid), None)

    def limit(self, uid: int, percentage: int, memory_mib: Mapping[str, int]) -> str | None:
        """Set the limits of ``uid``'s server; ``None`` on success, else what failed.

        ``memory_mib`` maps a device UUID to its pinned memory limit.
        """
        server = self.server_for(uid)
        if server is None:
            return f"no MPS server could be started for uid {uid} (is the daemon running?)"
        orders = [f"set_active_thread_percentage {server} {percentage}"]
        orders += [
            f"set_device_pinned_mem_limit {server} {uuid} {mib}M"
            for uuid, mib in sorted(memory_mib.items())
        ]
        for order in orders:
            if self._run(order) is None:
                return f"the MPS daemon refused {order!r}"
        return None
