"""What a client can read from a pool running on this machine (standalone mode).

The server does not (yet) serve job logs or which device each slice is on, but the local
agent keeps both on disk under ``$GPUPOOL_HOME/agent/<node>/``: one folder per replica
(**assignment**) in ``jobs/`` while it runs and in ``done/`` after, holding ``assignment.json``
(the job id, device UUIDs and slice), ``stdout.log`` and ``stderr.log``. This module reads those
files, with the standard library only, and never writes.

- :func:`find_replicas` lists the replica folders of one job (every node, every attempt);
- :func:`running_slices` lists the slices of replicas still running, for ``gpupool top``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LocalReplica:
    """One replica folder: ``running`` is True while it is in ``jobs/`` (not ``done/``)."""

    node: str
    assignment_id: str
    job_id: str
    job_name: str
    rank: int
    restart_count: int
    device_uuids: tuple[str, ...]
    milli_per_device: int
    memory_mib_per_device: int
    running: bool
    path: Path

    @property
    def stdout(self) -> Path:
        return self.path / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr.log"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _replicas(home: Path) -> Iterator[LocalReplica]:
    agents = home / "agent"
    if not agents.is_dir():
        return
    for node_dir in sorted(p for p in agents.iterdir() if p.is_dir()):
        for kind in ("jobs", "done"):
            folder = node_dir / kind
            if not folder.is_dir():
                continue
            for replica in sorted(folder.iterdir()):
                data = _read(replica / "assignment.json")
                spec = data.get("assignment") if data else None
                if not isinstance(spec, dict) or "job_id" not in spec:
                    continue
                yield LocalReplica(
                    node=node_dir.name,
                    assignment_id=str(spec.get("assignment_id", replica.name)),
                    job_id=str(spec["job_id"]),
                    job_name=str(spec.get("job_name", "")),
                    rank=int(spec.get("replica_rank", 0)),
                    restart_count=int(spec.get("restart_count", 0)),
                    device_uuids=tuple(str(u) for u in spec.get("device_uuids", [])),
                    milli_per_device=int(spec.get("milli_per_device", 0)),
                    memory_mib_per_device=int(spec.get("memory_mib_per_device", 0)),
                    running=kind == "jobs",
                    path=replica,
                )


def find_replicas(home: Path, job_id: str) -> list[LocalReplica]:
    """The job's replica folders on this machine, latest attempt last, rank order within one."""
    found = [r for r in _replicas(home) if r.job_id == job_id]
    return sorted(found, key=lambda r: (r.restart_count, r.rank, r.node))


def running_slices(home: Path) -> list[LocalReplica]:
    """Every replica still running on this machine's agents."""
    return [r for r in _replicas(home) if r.running]
