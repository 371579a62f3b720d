"""A cgroup (v2) per replica, where the node has the unified hierarchy and lets the agent in.

A job's processes can leave its session and process group (``setsid()``, a daemonising
launcher); a cgroup they cannot leave. When the node mounts cgroup v2 (``cgroup.controllers``
at the root) and the agent may create folders in its own cgroup, the executor moves each
replica's supervisor into ``<agent's cgroup>/gpupool/<assignment id>`` right after starting
it (before it starts the job), so every process of the job is born there; ending the job
kills the whole cgroup (``cgroup.kill``, or ``SIGKILL`` to each member on kernels before
5.14) and removes it. No controller is enabled: the cgroup only groups processes.

Elsewhere (cgroup v1, no permission) :func:`open_cgroups` gives ``None`` and the executor
falls back to the process walk of :mod:`gpupool.runtime.procs` (the job's marker variable).
Under systemd the agent's unit needs ``KillMode=process`` (the jobs outlive an agent restart)
and ``Delegate=yes`` (systemd leaves the sub-cgroups alone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger("gpupool.agent")

ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(proc_self: Path) -> str | None:
    """The agent's cgroup v2 path (``0::/system.slice/x.service`` -> that path)."""
    try:
        for line in proc_self.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        return None
    return None


class JobCgroups:
    """Creates, fills and kills the replicas' cgroups below ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def path(self, key: str) -> Path:
        return self.base / key

    def place(self, key: str, pid: int) -> bool:
        """Move ``pid`` (a supervisor, before it starts the job) into the replica's cgroup."""
        folder = self.path(key)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            return False
        return True

    def members(self, key: str) -> list[int]:
        try:
            text = (self.path(key) / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(w) for w in text.split() if w.isdigit()]

    def kill(self, key: str, *, spare: int | None = None) -> list[int]:
        """SIGKILL every member (but ``spare``, the supervisor writing the result); their pids."""
        members = [p for p in self.members(key) if p != spare]
        if spare is None and (self.path(key) / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path(key) / "cgroup.kill").write_text("1\n")
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return members

    def remove(self, key: str) -> None:
        """Remove the replica's cgroup once it is empty (the kernel refuses otherwise)."""
        with contextlib.suppress(OSError):
            self.path(key).rmdir()


def _without(why: str) -> JobCgroups | None:
    """No cgroups: say why once, at the agent's start."""
    log.warning(
        "no cgroup per replica (%s): jobs are tracked by their process sessions; under "
        "systemd, give the agent's unit Delegate=yes (deploy/systemd/gpupool-agent.service)",
        why,
    )
    return None


def open_cgroups(
    root: Path = ROOT, proc_self: Path = Path("/proc/self/cgroup")
) -> JobCgroups | None:
    """The replicas' cgroups, or ``None`` where cgroup v2 cannot be used (see the docstring)."""
    if not (root / "cgroup.controllers").exists():
        # cgroup v1 or hybrid: no unified hierarchy to put jobs in
        return _without("the node has no unified cgroup v2 hierarchy")
    own = _own_cgroup(proc_self)
    if own is None:
        return _without(f"{proc_self} names no cgroup v2 path")
    base = root / own.lstrip("/") / "gpupool"
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        return _without(f"cannot create {base}: {exc.strerror}")
    if not os.access(base, os.W_OK):
        return _without(f"{base} is not writable by this account")
    return JobCgroups(base)
