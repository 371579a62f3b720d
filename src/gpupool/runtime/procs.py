"""Reading Linux process facts from ``/proc``: sessions, start times, liveness.

The agent starts each job in its own session, so "the processes of a job" are the processes
whose session id is the job leader's pid; NVML reports per-process GPU memory by pid, and this
module maps those pids back to jobs.
"""

from __future__ import annotations

import os

#: A ``str``, not a ``pathlib.Path``: every job's supervisor imports this module at start-up,
#: and ``pathlib`` (with ``fnmatch``, ``re`` and ``urllib``) would cost it a few ms.
_PROC = "/proc"


def _read(pid: int, name: str) -> bytes:
    with open(os.path.join(_PROC, str(pid), name), "rb") as f:
        return f.read()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = _read(pid, "stat").decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    close = text.rfind(")")
    return text[close + 2 :].split()


def session_of(pid: int) -> int | None:
    """The session id of ``pid``, or ``None`` when it is gone or unreadable."""
    fields = _stat_fields(pid)
    return int(fields[3]) if fields is not None else None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, identifies a process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def is_alive(pid: int, ticks: int | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``ticks``."""
    fields = _stat_fields(pid)
    if fields is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return ticks is None
    if fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB (from ``/proc/<pid>/status``)."""
    try:
        for line in _read(pid, "status").decode(errors="replace").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or ``None`` when it is gone or unreadable."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (children, their children...)."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        ppid = parent_of(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def marked(name: str, value: str) -> list[int]:
    """Processes whose environment has ``name=value``.

    A job's processes inherit the agent's marker variable (``GPUPOOL_REPLICA_DIR``), also the
    ones that left its session with ``setsid()`` and were re-parented to init, where neither
    the process group nor the tree finds them. Unreadable environments (another user's process
    while the agent is not root) are skipped.
    """
    needle = f"{name}={value}".encode()
    found = []
    for pid in _pids():
        try:
            environ = _read(pid, "environ")
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found
