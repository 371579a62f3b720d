"""Which replicas may use MPS, and the limits their MPS server gets (pure functions).

An MPS server runs as one Unix user and serves all of that user's MPS clients; a second user's
client waits until the first user's clients have all ended (a job that looks hung in CUDA
start-up). So on one GPU only one user's replicas run under MPS at a time: another user's
replica gets the next mode ``auto`` allows (``soft``), or is refused when it asked for ``mps``.

The server's limits bound every client of that user: the active-thread percentage is the
largest share the user holds on this node, and the pinned memory limit per device (by UUID)
the largest slice there. Each client's own environment asks for exactly its slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.runtime.isolation import mps_thread_percentage


@dataclass(frozen=True)
class MpsTenant:
    """A live replica as MPS sees it: its Unix user, devices and share per device."""

    uid: int
    device_uuids: tuple[str, ...]
    milli: int
    memory_mib: int


def conflict(live: Iterable[MpsTenant], uid: int, devices: Iterable[str]) -> str | None:
    """Why a replica of ``uid`` may not use MPS on ``devices``, or ``None``."""
    wanted = set(devices)
    for other in live:
        shared = wanted & set(other.device_uuids)
        if other.uid != uid and shared:
            return (
                f"MPS serves one Unix user at a time and GPU {sorted(shared)[0]} runs MPS jobs "
                f"of uid {other.uid}"
            )
    return None


def server_limits(live: Iterable[MpsTenant], uid: int) -> tuple[int, dict[str, int]]:
    """The active-thread percentage and pinned memory per device for ``uid``'s server."""
    percentage = 0
    memory: dict[str, int] = {}
    for t in live:
        if t.uid != uid:
            continue
        percentage = max(percentage, mps_thread_percentage(t.milli))
        for uuid in t.device_uuids:
            memory[uuid] = max(memory.get(uuid, 0), t.memory_mib)
    return max(1, percentage), memory
