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
#: A job's packed results (see :mod:`gpupool.agent.jobsteps`), or why there are none.
RESULTS = "results.tar.gz"
RESULTS_PROBLEM = "results-problem.txt"

#: The agent's record of its last contact with the server, in its state folder (beside
#: ``jobs/``): ``{"monotonic": seconds, "node_timeout_s": seconds or null}``. The agent's fence
#: and every supervisor's read it (see :mod:`gpupool.agent.fence`).
CONTACT = "contact.json"
#: Share of the server's node timeout of silence after which replicas are stopped.
FENCE_AT = 0.5
#: Share of the node timeout by which the stopped replicas are killed (the grace is cut to fit).
KILL_BY = 0.75
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
    "unpack": None,  # {"archive", "max_bytes", "max_s"}: unpack the upload first (jobsteps)
    "pack": None,  # {"limit", "max_input_bytes", "max_s"}: pack the results at the end
    # Containers (see gpupool.containers.engines.ContainerPlan): argv lists run before the
    # program (a failure is a boot failure) and after it (always), and the program's exit codes
    # that mean it never started (see gpupool.agent.supervisor).
    "prepare": [],
    "cleanup": [],
    "boot_failure": {},
    # issue 27: {"address", "key"}: a terminal relayed to gpupool run --pty (agent/ptyrelay.py);
    # the job's -o/-e files, absolute and expanded (the same path twice: one file for both)
    "pty": None,
    "stdout_file": None,
    "stderr_file": None,
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


def fence_stop(contact: dict[str, Any] | None, now: float, grace_s: float) -> float | None:
    """The grace (seconds) to stop a replica with when ``contact`` (a contact record) says the
    server has been silent for :data:`FENCE_AT` of its node timeout at monotonic ``now``;
    ``None`` when it has not (or there is no record, or no node timeout)."""
    if not contact:
        return None
    try:
        last = float(contact["monotonic"])
        timeout = contact.get("node_timeout_s")
        timeout = float(timeout) if timeout is not None else None
    except (KeyError, TypeError, ValueError):
        return None
    if timeout is None or now - last < FENCE_AT * timeout:
        return None
    return max(0.0, min(grace_s, last + KILL_BY * timeout - now))
