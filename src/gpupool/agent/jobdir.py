"""The on-disk record of one replica on a node: its job folder.

The agent and the replica's supervisor talk only through these files, so either may restart
without the other losing anything. Every write is atomic (write a temporary file, then rename).

``<state>/jobs/<assignment id>/``:

- ``assignment.json`` (agent): the assignment as the server sent it, and the isolation mode
  the agent chose;
- ``launch.json`` (agent): what to run: argv, env, cwd, time limit, stop signal and grace;
- ``state.json`` (supervisor): its pid, the job's pid, ``status`` and, at the end, the exit
  code or signal and the stop reason;
- ``stop.json`` (agent): a stop request: reason, signal, grace (the supervisor acts on it);
- ``stdout.log``, ``stderr.log`` (supervisor): the job's output, capped at ``log_cap_bytes``.

``status`` is ``starting`` (supervisor up, job not yet), ``running``, ``boot_failed`` (could not
start the program; ``reason`` says why) or ``exited``. This module is the agent's typed view
of the folder; the names, defaults and JSON helpers are in :mod:`gpupool.agent.jobfiles`, which
the supervisor imports instead of this module so that it starts fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpupool.agent import jobfiles
from gpupool.agent.jobfiles import (
    BOOT_FAILED,
    DEFAULT_GRACE_S,
    DEFAULT_LOG_CAP_BYTES,
    DEFAULT_STOP_SIGNAL,
    EXITED,
    RUNNING,
    STARTING,
    read_json,
    write_json,
)

__all__ = [
    "BOOT_FAILED",
    "EXITED",
    "RUNNING",
    "STARTING",
    "JobDir",
    "LaunchSpec",
    "ProcessState",
    "StopRequest",
    "read_json",
    "write_json",
]


@dataclass(frozen=True)
class LaunchSpec:
    """What the supervisor runs. ``time_limit_s`` ``None`` means none; signals by name;
    ``uid``/``gid``/``groups`` set: the program runs as that account (see agent/runas.py)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    time_limit_s: float | None = None
    stop_signal: str = DEFAULT_STOP_SIGNAL
    grace_s: float = DEFAULT_GRACE_S
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    uid: int | None = None  # run as this account (``None``: the supervisor's own)
    gid: int | None = None
    groups: list[int] = field(default_factory=list)
    unpack: dict[str, Any] | None = None  # steps of agent/jobsteps.py, on a budget
    pack: dict[str, Any] | None = None
    #: A container job's steps (gpupool.containers.engines.ContainerPlan); empty for a bare one.
    prepare: list[list[str]] = field(default_factory=list)
    cleanup: list[list[str]] = field(default_factory=list)
    boot_failure: dict[str, Any] = field(default_factory=dict)
    pty: dict[str, str] | None = None  # run --pty's endpoint (agent/ptyrelay.py)
    stdout_file: str | None = None  # -o, expanded, absolute
    stderr_file: str | None = None  # -e (the -o file when only -o was given)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchSpec:
        return cls(**data)


@dataclass(frozen=True)
class StopRequest:
    reason: str
    signal: str = DEFAULT_STOP_SIGNAL
    grace_s: float = DEFAULT_GRACE_S


@dataclass(frozen=True)
class ProcessState:
    """What ``state.json`` says (see the module docstring)."""

    status: str
    supervisor_pid: int | None = None
    supervisor_ticks: int | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    stop_reason: str | None = None
    reason: str | None = None
    #: A boot failure every attempt would meet again (the image lacks the program, a mount the
    #: job's account may not read): the server does not requeue the job for it.
    final: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessState:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "extra"}
        return cls(**known)

    @property
    def finished(self) -> bool:
        return self.status in (EXITED, BOOT_FAILED)


class JobDir:
    """Paths and file access for one replica's folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.assignment = path / jobfiles.ASSIGNMENT
        self.launch = path / jobfiles.LAUNCH
        self.state = path / jobfiles.STATE
        self.stop = path / jobfiles.STOP
        self.stdout = path / jobfiles.STDOUT
        self.stderr = path / jobfiles.STDERR

    @property
    def key(self) -> str:
        return self.path.name

    def read_state(self) -> ProcessState | None:
        data = read_json(self.state)
        return ProcessState.from_json(data) if data is not None else None

    def write_state(self, state: ProcessState) -> None:
        data = asdict(state)
        data.pop("extra", None)
        write_json(self.state, data)

    def read_stop(self) -> StopRequest | None:
        data = read_json(self.stop)
        return StopRequest(*jobfiles.stop_record(data)) if data is not None else None

    def write_stop(self, request: StopRequest) -> None:
        write_json(self.stop, asdict(request))
