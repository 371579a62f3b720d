"""Reading what a replica uses: GPU memory per device, and when it last checkpointed.

**GPU memory**: NVML reports memory per process (pid). A job's processes are those whose session
id is the job leader's pid (the supervisor starts every job in a new session), so a reading is
credited to the replica whose job pid is the process itself or its session leader.

When NVML's pids are not this machine's (an agent in a container without the host PID
namespace), a replica alone on its device is credited with the device's used memory instead;
the agent says so once.

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


def foreign_pids(telemetry: Telemetry) -> dict[str, int]:
    """Per device, MiB held by processes NVML lists but this machine's ``/proc`` lacks.

    Those pids are from another PID namespace: an agent in a container without the host's PID
    namespace sees NVML's host pids and cannot map them to jobs.
    """
    found: dict[str, int] = {}
    for sample in telemetry.devices:
        for proc in sample.processes:
            if not os.path.exists(f"/proc/{proc.pid}"):
                found[sample.uuid] = found.get(sample.uuid, 0) + (proc.used_memory_mib or 0)
    return found


def owner_of(pid: int, job_pids: Mapping[int, str]) -> str | None:
    """The replica key whose job ``pid`` belongs to (itself the leader, or in its session)."""
    key = job_pids.get(pid)
    if key is None:
        sid = session_of(pid)
        key = job_pids.get(sid) if sid is not None else None
    return key


def pids_on_devices(
    telemetry: Telemetry, job_pids: Mapping[int, str]
) -> list[tuple[int, str, str]]:
    """``(pid, replica key or "", device UUID)`` for every process NVML lists."""
    return [
        (proc.pid, owner_of(proc.pid, job_pids) or "", sample.uuid)
        for sample in telemetry.devices
        for proc in sample.processes
    ]


def with_device_totals(
    usage: dict[str, dict[str, int]],
    telemetry: Telemetry,
    foreign: Mapping[str, int],
    running: Mapping[str, tuple[str, ...]],
) -> dict[str, dict[str, int]]:
    """``usage`` completed from device totals where pids could not be mapped.

    On a device whose processes are from another PID namespace (``foreign``), a replica that is
    the only one running there is credited with the device's used memory; with several, no
    share can be told apart and none is credited. ``running`` maps a replica key to its devices.
    """
    samples = telemetry.by_uuid()
    for uuid in foreign:
        on_device = [key for key, devices in running.items() if uuid in devices]
        sample = samples.get(uuid)
        if len(on_device) != 1 or sample is None or sample.memory_used_mib is None:
            continue
        per = usage.setdefault(on_device[0], {})
        per.setdefault(uuid, sample.memory_used_mib)
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
