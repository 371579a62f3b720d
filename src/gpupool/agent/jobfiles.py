"""The job folder's file format, with nothing but ``os`` and ``json``: what the supervisor reads.

Every replica starts a supervisor (:mod:`gpupool.agent.supervisor`), a fresh Python process, and
on a node that runs many short jobs its start-up is part of every job's start: on the 2-core
development machine 40 supervisors that imported ``pathlib``, ``dataclasses`` (which pulls
``inspect``) and ``typing`` spent about 40 ms of CPU each before running a line of their own.
So the supervisor works on plain dicts and ``str`` paths through this module, and
:mod:`gpupool.agent.jobdir` builds the agent's typed view (dataclasses, :class:`pathlib.Path`)
on the same names and defaults. ``tests/agent/test_supervisor_startup.py`` keeps the
supervisor's imports this small.

Words: a **launch record** is ``launch.json`` as a dict, a **state record** ``state.json``.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # ``typing`` itself costs a few ms at start-up: only mypy reads this
if TYPE_CHECKING:
    from typing import Any

STARTING = "starting"
RUNNING = "running"
BOOT_FAILED = "boot_failed"
EXITED = "exited"

ASSIGNMENT = "assignment.json"
LAUNCH = "launch.json"
STATE = "state.json"
STOP = "stop.json"
STDOUT = "stdout.log"
STDERR = "stderr.log"
PREPARE_LOG = "prepare.log"

DEFAULT_STOP_SIGNAL = "SIGTERM"
#: Seconds between the stop signal and ``SIGKILL``.
DEFAULT_GRACE_S = 30.0
#: Bytes of each of stdout and stderr kept.
DEFAULT_LOG_CAP_BYTES = 64 * 1024 * 1024

#: A launch record's keys with their defaults (``argv``, ``env`` and ``cwd`` have none).
LAUNCH_DEFAULTS: dict[str, Any] = {
    "time_limit_s": None,
    "stop_signal": DEFAULT_STOP_SIGNAL,
    "grace_s": DEFAULT_GRACE_S,
    "log_cap_bytes": DEFAULT_LOG_CAP_BYTES,
    "uid": None,
    "gid": None,
    "groups": [],
    # Containers (see gpupool.containers.engines.ContainerPlan): argv lists run before the
    # program (a failure is a boot failure) and after it (always), and the program's exit codes
    # that mean it never started (see gpupool.agent.supervisor).
    "prepare": [],
    "cleanup": [],
    "boot_failure": {},
}
LAUNCH_REQUIRED = ("argv", "env", "cwd")

#: Every key of a state record, in the order of :class:`gpupool.agent.jobdir.ProcessState`.
STATE_FIELDS = (
    "status",
    "supervisor_pid",
    "supervisor_ticks",
    "pid",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "stop_reason",
    "reason",
    "final",
)


def write_json(path: str | os.PathLike[str], data: dict[str, Any], *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (readers see the old or the new file, never half).

    ``durable``: on disk before the rename (``fsync``), so that it survives a node crash too.
    A record that a crash makes moot anyway may skip it (an fsync costs 10-20 ms on a busy
    disk, and the supervisor writes several records per job)."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def launch_record(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every default filled in; ``ValueError`` naming the key that is wrong."""
    missing = [k for k in LAUNCH_REQUIRED if k not in data]
    unknown = sorted(k for k in data if k not in LAUNCH_DEFAULTS and k not in LAUNCH_REQUIRED)
    if missing or unknown:
        raise ValueError(
            "launch.json is not a launch record"
            + (f": missing {', '.join(missing)}" if missing else "")
            + (f": unknown {', '.join(unknown)}" if unknown else "")
        )
    return {**LAUNCH_DEFAULTS, "groups": [], "prepare": [], "cleanup": [], **data}


def state_record(fields: dict[str, Any]) -> dict[str, Any]:
    """A state record with every key of :data:`STATE_FIELDS` (``None`` where not given)."""
    return {k: fields.get(k) for k in STATE_FIELDS}


def stop_record(data: dict[str, Any]) -> tuple[str, str, float]:
    """A stop request's reason, signal name and grace (s), with the defaults filled in."""
    return (
        str(data.get("reason", "cancel")),
        str(data.get("signal", DEFAULT_STOP_SIGNAL)),
        float(data.get("grace_s", DEFAULT_GRACE_S)),
    )
