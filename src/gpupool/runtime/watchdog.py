"""The soft-isolation memory watchdog and the memory-pressure rule, as pure functions of state.

Both read GPU memory per job (the agent sums NVML's per-process memory over a job's processes)
and say what to do; the agent does it. Times are seconds from the agent's clock.

**Watchdog** (soft isolation): a job using more than its memory slice on a device, plus the
CUDA context reserve of that GPU model (``reserve_mib``, see :mod:`gpupool.gpu.context`: NVML
counts the context, the framework caps do not) and ``tolerance_mib``, is first *signalled*
(its checkpoint signal, so it can save and shrink); if it is still over ``grace_s`` seconds
after it first went over, it is *stopped* (reason ``memory``, the job ends OUT_OF_MEMORY).
Going back under resets it.

**Pressure** (overcommitted pools): when a device's used memory reaches ``threshold`` of its
usable memory (physical less what the driver reserves), the lowest-priority preemptible
replica on it is stopped (reason ``pressure``, requeued by the server), one at a time per
device: while a pressure victim is
stopping on a device, no second one is chosen there.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.domain.units import format_memory


class Action(enum.Enum):
    SIGNAL = "signal"  # send the checkpoint signal, keep running
    STOP = "stop"  # stop the replica (signal, grace, kill)


@dataclass(frozen=True)
class WatchedReplica:
    """A running replica as the watchdog and the pressure rule see it.

    ``memory_limit_mib`` is its slice per device; ``usage_mib`` its measured memory per device
    UUID (devices with no reading are absent); ``reserve_mib`` the CUDA context reserve its
    processes may hold beyond the slice. ``stopping`` is True once a stop was ordered.
    """

    key: str
    device_uuids: tuple[str, ...]
    memory_limit_mib: int
    usage_mib: Mapping[str, int]
    priority: int = 0
    preemptible: bool = False
    watched: bool = True  # soft isolation: the watchdog applies
    stopping: bool = False
    reserve_mib: int = 0


@dataclass(frozen=True)
class Verdict:
    key: str
    action: Action
    reason: str


class MemoryWatchdog:
    """Remembers since when each replica is over its memory slice."""

    def __init__(self, grace_s: float = 30.0, tolerance_mib: int = 64) -> None:
        self.grace_s = grace_s
        self.tolerance_mib = tolerance_mib
        self._over_since: dict[str, float] = {}

    def check(self, now: float, replicas: Iterable[WatchedReplica]) -> list[Verdict]:
        verdicts: list[Verdict] = []
        seen: set[str] = set()
        for r in replicas:
            seen.add(r.key)
            if not r.watched or r.stopping:
                continue
            over = {
                uuid: used
                for uuid, used in r.usage_mib.items()
                if used > r.memory_limit_mib + r.reserve_mib + self.tolerance_mib
            }
            if not over:
                self._over_since.pop(r.key, None)
                continue
            uuid, used = max(over.items(), key=lambda kv: kv[1])
            what = (
                f"uses {format_memory(used)} of GPU memory on {uuid}, over its slice of "
                f"{format_memory(r.memory_limit_mib)} and the CUDA context reserve of "
                f"{format_memory(r.reserve_mib)}"
            )
            since = self._over_since.get(r.key)
            if since is None:
                self._over_since[r.key] = now
                verdicts.append(Verdict(r.key, Action.SIGNAL, f"{what}: signalled to shrink"))
            elif now - since >= self.grace_s:
                verdicts.append(
                    Verdict(r.key, Action.STOP, f"{what} for {now - since:.0f}s: stopped")
                )
        for key in set(self._over_since) - seen:
            del self._over_since[key]
        return verdicts


def pressure_victims(
    device_memory: Mapping[str, tuple[int, int]],
    replicas: Iterable[WatchedReplica],
    threshold: float = 0.95,
    stopping_for_pressure: frozenset[str] = frozenset(),
) -> list[Verdict]:
    """Replicas to stop because their device nears physical memory.

    ``device_memory`` maps a device UUID to ``(used_mib, total_mib)``. At most one victim per
    device, and none on a device where a replica in ``stopping_for_pressure`` still runs.
    """
    replicas = list(replicas)
    chosen: list[Verdict] = []
    taken: set[str] = set()
    for uuid in sorted(device_memory):
        used, total = device_memory[uuid]
        if total <= 0 or used < threshold * total:
            continue
        on_device = [r for r in replicas if uuid in r.device_uuids]
        if any(r.key in stopping_for_pressure for r in on_device):
            continue  # a victim is already on its way out here
        candidates = [
            r for r in on_device if r.preemptible and not r.stopping and r.key not in taken
        ]
        if not candidates:
            continue
        victim = min(candidates, key=lambda r: (r.priority, -sum(r.usage_mib.values()), r.key))
        taken.add(victim.key)
        chosen.append(
            Verdict(
                victim.key,
                Action.STOP,
                f"memory pressure on {uuid}: {format_memory(used)} of {format_memory(total)} "
                f"used (>= {threshold:.0%}); stopped the lowest-priority opportunistic job",
            )
        )
    return chosen
