"""Container engines: how a node runs a job's command in an image (podman, docker).

An :class:`Engine` turns a :class:`ContainerJob` (what the agent decided: image, command,
account, mounts, the replica's CDI device) into a :class:`ContainerPlan`: argv lists the
replica's supervisor runs, with nothing engine-specific left for the agent or the supervisor:

- ``prepare``: run in order before the job; any failure is the replica's boot failure with
  the engine's message (an image already on the node is not pulled; a pull is tried once);
- ``argv``: the job itself, attached, so stdout, stderr and the exit code are the container's,
  byte for byte, and signals sent to it are passed to the container's process;
- ``cleanup``: run after the job ended however it ended (also after ``SIGKILL`` of the
  attached client), so that the whole container is gone;
- ``boot_failure``: how an end of ``argv`` that means the engine could not start the
  container's program (a missing entrypoint) looks: the exit code the engine keeps for its own
  errors (125); such an end is a boot failure, not the job's own exit.

Engines are found by name in :data:`ENGINES` (no ``if name ==`` chains); :func:`detect` says
which of them a node can use and, for the others, what is missing.

podman notes (4.3, Debian): it runs as root (the agent's account) and the container's
process as the job's account (``--user``, ``no-new-privileges``); the agent writes its own
``containers.conf`` (:func:`write_containers_conf`: ``runc``, ``cgroupfs``, no default
ulimits), which works on hybrid cgroup hosts where ``crun`` refuses.

**Host PID and network namespaces.** A container job shares the node's PID namespace
(``--pid host``): the shim's region records and reaps its processes by PID, and the agent's
rules (memory watchdog, NVML's process lists, the replica marker that finds strays) match
host PIDs, so a job in its own PID namespace would have its slots reaped as "dead" and escape
its slice. It also means the job is not PID 1, so a stop signal acts as on a bare process.
It shares the node's network (``--network host``) so that a gang's ``MASTER_ADDR`` and
``MASTER_PORT`` work as they do for bare jobs. Its file system, mounts, devices and account
are the container's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpupool.domain.containers import Mount

#: What the agent writes as its engines' configuration (podman's ``CONTAINERS_CONF``).
CONTAINERS_CONF = """\
# Written by the gpupool agent: the settings its container jobs run with.
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


@dataclass(frozen=True)
class EngineCheck:
    """Whether an engine works on this node; ``missing`` says what to install when not."""

    name: str
    available: bool
    version: str | None = None
    missing: str | None = None


@dataclass(frozen=True)
class ContainerJob:
    """One replica to run in a container. ``env`` names the variables to set inside: their
    values are in the engine process's environment (so no value shows in ``ps``)."""

    name: str  # the container's name, unique on the node
    image: str
    argv: tuple[str, ...]
    env_names: tuple[str, ...]
    user: tuple[int, int] | None  # uid, gid inside; None: the image's user
    groups: tuple[int, ...] = ()
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    cdi_device: str | None = None  # KIND=NAME of the replica's slice
    entrypoint_reset: bool = False


@dataclass(frozen=True)
class ContainerPlan:
    prepare: list[list[str]]
    argv: list[str]
    cleanup: list[list[str]]
    boot_failure: dict[str, list[int] | list[str] | str] = field(default_factory=dict)


class Engine(Protocol):
    """A container engine (see the module docstring)."""

    name: str

    def check(self, env: Mapping[str, str], *, deep: bool = False) -> EngineCheck:
        """Whether it works here (runs the engine's binary: agent start and precheck only)."""
        ...

    def plan(self, job: ContainerJob) -> ContainerPlan:
        """The supervisor's argv lists for ``job`` (pure)."""
        ...


def _run(argv: list[str], env: Mapping[str, str], timeout: float = 20.0) -> tuple[int, str]:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=dict(env), timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


class OciCli:
    """podman and docker share their command line; the differences are attributes."""

    name = ""
    binary = ""

    def check(self, env: Mapping[str, str], *, deep: bool = False) -> EngineCheck:
        """Fast by default (the binary, its version, what it needs beside it: agent start);
        ``deep`` also asks the engine to describe its host (``gpupool precheck``)."""
        path = shutil.which(self.binary, path=env.get("PATH"))
        if path is None:
            return EngineCheck(self.name, False, missing=f"{self.binary} is not installed")
        code, out = _run([path, "--version"], env)
        if code != 0:
            return EngineCheck(self.name, False, missing=f"{self.binary} --version failed: {out}")
        found = re.search(r"version v?([0-9][\w.+-]*?),?(?:\s|$)", out)
        version = found.group(1) if found else None
        missing = self.missing(env)
        if missing is None and deep:
            missing = self.deep_missing(path, env)
        return EngineCheck(self.name, missing is None, version, missing)

    def missing(self, env: Mapping[str, str]) -> str | None:
        """What the engine lacks here, found without running it (``None``: nothing)."""
        return None

    def deep_missing(self, path: str, env: Mapping[str, str]) -> str | None:
        code, out = _run([path, "info", "--format", "{{.Host.OCIRuntime.Name}}"], env, 60)
        return None if code == 0 else f"{self.binary} info failed: {out[-300:]}"

    def create_flags(self, job: ContainerJob) -> list[str]:
        return []

    def plan(self, job: ContainerJob) -> ContainerPlan:
        b = self.binary
        create = [b, "create", "--rm", "--name", job.name, "--pull", "never"]
        create += ["--network", "host", "--pid", "host", *self.create_flags(job)]
        if job.user is not None:
            create += ["--user", f"{job.user[0]}:{job.user[1]}"]
            create += [f"--group-add={g}" for g in job.groups if g != job.user[1]]
            create += ["--security-opt", "no-new-privileges"]
        if job.cdi_device is not None:
            create += ["--device", job.cdi_device]
        for m in job.mounts:
            create += ["--volume", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        if job.workdir is not None:
            create += ["--workdir", job.workdir]
        for name in job.env_names:
            create += ["--env", name]
        create += ["--", job.image, *job.argv]
        pull = [
            "/bin/sh",
            "-c",
            f'{b} image inspect --format "{{{{.Id}}}}" "$1" >/dev/null 2>&1 || {b} pull "$1"',
            "pull",
            job.image,
        ]
        return ContainerPlan(
            prepare=[pull, create],
            argv=[b, "start", "--attach", job.name],
            cleanup=[[b, "rm", "--force", "--time", "0", job.name]],
            boot_failure={
                "exit_codes": [125],
                "what": f"cannot start {' '.join(job.argv)!r} in image {job.image}",
            },
        )


class Podman(OciCli):
    name = "podman"
    binary = "podman"

    def missing(self, env: Mapping[str, str]) -> str | None:
        if shutil.which("runc", path=env.get("PATH")) is None:
            return "runc is not installed (the agent's containers.conf runs podman with runc)"
        return None

    def create_flags(self, job: ContainerJob) -> list[str]:
        return ["--log-driver", "none"]  # the supervisor keeps the logs


class Docker(OciCli):
    name = "docker"
    binary = "docker"

    def missing(self, env: Mapping[str, str]) -> str | None:
        host = env.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        if host.startswith("unix://") and not os.path.exists(host[len("unix://") :]):
            return f"the docker daemon is not running (no {host[len('unix://') :]})"
        return None

    def deep_missing(self, path: str, env: Mapping[str, str]) -> str | None:
        code, out = _run([path, "info", "--format", "{{.ServerVersion}}"], env, 60)
        return None if code == 0 else f"docker info failed: {out[-300:]}"


#: Engines by name, in the order a node prefers them when a pool names no default.
ENGINES: dict[str, Engine] = {"podman": Podman(), "docker": Docker()}


def detect(env: Mapping[str, str], *, deep: bool = False) -> list[EngineCheck]:
    """Every known engine's check on this node."""
    return [engine.check(env, deep=deep) for engine in ENGINES.values()]


def write_containers_conf(folder: Path) -> Path:
    """The agent's ``containers.conf`` in ``folder`` (rewritten when it differs)."""
    path = folder / "containers.conf"
    if not path.exists() or path.read_text(encoding="utf-8") != CONTAINERS_CONF:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(CONTAINERS_CONF, encoding="utf-8")
        os.replace(tmp, path)
    return path
