"""Reading what a replica uses: GPU memory per device, and when it last checkpointed.

**GPU memory**: NVML reports memory per process (pid). A job's processes are those whose session
id is the job leader's pid (the supervisor starts every job in a new session), so a reading is
credited to the replica whose job pid is the process itself or its session leader.

**Checkpoint time**: the newest modification time of any file in the replica's checkpoint folder,
or ``None`` while the folder is empty.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpupool.gpu.base import Telemetry
from gpupool.runtime.procs import session_of


def usage_by_replica(
    telemetry: Telemetry, job_pids: Mapping[int, str]
) -> dict[str, dict[str, int]]:
    """MiB per replica key and device UUID; ``job_pids`` maps a job leader's pid to its key."""
    usage: dict[str, dict[str, int]] = {}
    for sample in telemetry.devices:
        for proc in sample.processes:
            if proc.used_memory_mib is None:
                continue
            key = job_pids.get(proc.pid)
            if key is None:
                sid = session_of(proc.pid)
                key = job_pids.get(sid) if sid is not None else None
            if key is None:
                continue
            per = usage.setdefault(key, {})
            per[sample.uuid] = per.get(sample.uuid, 0) + proc.used_memory_mib
    return usage


def newest_mtime(path: str | None) -> float | None:
    """When the newest file in ``path`` was written; ``None`` when empty or missing."""
    if path is None:
        return None
    try:
        with os.scandir(path) as entries:
            times = [e.stat().st_mtime for e in entries]
    except OSError:
        return None
    return max(times) if times else None
