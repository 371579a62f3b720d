"""The agent's rules that read GPU telemetry, apart from the protocol loop in ``agent.py``.

:class:`GpuRules` is mixed into :class:`~gpupool.agent.agent.Agent`; it owns what the agent
decides from each sample:

- **memory** (:meth:`GpuRules._enforce_memory`): the soft-isolation watchdog (slice plus the
  CUDA context reserve of the GPU model) and the memory-pressure rule, with per-process memory
  mapped to replicas by session, or device totals where pids are from another PID namespace;
- **release** (:meth:`GpuRules._release`): an ended replica's slices are reported free only
  once NVML no longer lists its processes, or after ``release_wait_s``, when the devices they
  still hold are reported unhealthy until NVML lets them go (:meth:`GpuRules._stuck_verdicts`);
- **MPS** (:mod:`gpupool.agent.mpsplan`): which replicas may use it, the limits set on their
  user's server, and the check that each MPS replica's processes really attached to one;
- **the CUDA shim** (:meth:`GpuRules._read_shim_regions`): a shim replica's exact usage per
  device comes from its region (not NVML's pid mapping) for the pressure rule, dead processes
  are reaped from it, and it is reported as ``shim`` only once a process attached; one that
  escaped (no process attached once NVML lists it, or after a bounded time; or, for the job's
  whole life, any GPU process NVML lists that stays unattached while others attached) is
  reported as running without the shim, with the reason. The region's usage is cross-checked
  with NVML's per-process memory where NVML reports it: a region that holds less than NVML
  sees (a job can write its own usage slots) is said in the replica's reason. Its region is
  deleted when it ends (:meth:`GpuRules._end_shim`).

Words: **listed** is what NVML lists per device this sample, ``{pid: replica key or ""}``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.agent import mpsplan
from gpupool.agent.executor import Executor, Observed
from gpupool.agent.jobdir import RUNNING, STARTING
from gpupool.agent.usage import (
    foreign_pids,
    pids_on_devices,
    usage_by_replica,
    with_device_totals,
)
from gpupool.control.machinery.clock import Clock
from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu.base import Telemetry
from gpupool.gpu.health import HealthVerdict
from gpupool.runtime.isolation import MPS_MODES, SHIM_MODES
from gpupool.runtime.mps import MpsDaemon
from gpupool.runtime.shim import MIB, Region, RegionError, RegionSnapshot, ShimIsolation
from gpupool.runtime.watchdog import Action, MemoryWatchdog, WatchedReplica, pressure_victims
from gpupool.schemas.agent import AssignmentSpec

if TYPE_CHECKING:
    from gpupool.agent.config import AgentConfig

log = logging.getLogger("gpupool.agent")
#: How far NVML's per-process memory of a shim replica may exceed its region's (beyond one
#: context reserve) before the agent says the region under-reports.
UNDERREPORT_MARGIN_MIB = 256


@dataclass
class Replica:
    """A replica this agent knows: its assignment and what the agent decided about it."""

    assignment: AssignmentSpec
    isolation: str | None
    observed: Observed | None = None
    local_reason: str | None = None  # why the agent itself stopped or signalled it
    local_stop: str | None = None  # the stop reason that goes with it (memory, pressure)
    isolation_reason: str | None = None  # why its mode is weaker than given (reported running)
    checkpoint_dir: str | None = None
    uid: int | None = None  # the Unix user its processes run as
    mps_verified: bool = False  # an MPS replica's process was seen attached to a server
    gpu_pids: set[int] = field(default_factory=set)  # its processes NVML has listed
    held_since: float | None = None  # ended, but NVML still lists its processes
    released: bool = False  # ended and its GPU memory is free (or the wait ran out)
    shim_region: str | None = None  # the CUDA shim's region of a shim replica
    shim_attached: bool = False  # a process of it was seen attached to the region
    shim_snapshot: RegionSnapshot | None = None  # the region's last read
    running_since: float | None = None  # monotonic, first seen running (for the shim check)
    listed_since: float | None = None  # monotonic, NVML first listed it while unattached
    unattached_since: dict[int, float] = field(default_factory=dict)  # GPU pid -> monotonic
    underreport_said: bool = False  # NVML's per-process memory exceeded the region's (logged)


class GpuRules:
    """See the module docstring. The agent provides the attributes declared here."""

    config: AgentConfig
    clock: Clock
    executor: Executor
    replicas: dict[str, Replica]
    watchdog: MemoryWatchdog
    mps: MpsDaemon | None
    _stuck: dict[str, set[int]]  # device -> pids of ended jobs NVML still lists
    _said_pid_namespace: bool
    _reserve: dict[str, int]  # device -> CUDA context reserve (MiB)
    _regions: dict[str, Region]  # shim region path -> the mapped region

    def _save_assignment(self, key: str, replica: Replica) -> None:
        raise NotImplementedError  # the agent's

    def _enforce_memory(self, telemetry: Telemetry) -> None:
        now = self.clock.now()
        usage = usage_by_replica(
            telemetry,
            {
                r.observed.pid: key
                for key, r in self.replicas.items()
                if r.observed is not None and r.observed.pid is not None
            },
        )
        foreign = foreign_pids(telemetry)
        if foreign and not self._said_pid_namespace:
            self._said_pid_namespace = True
            log.warning(
                "NVML lists GPU processes this agent cannot see (pids from another PID "
                "namespace: run the agent with the host's, e.g. docker --pid=host); per-job GPU "
                "memory falls back to device totals for a job alone on its GPU"
            )
        running = {
            key: tuple(r.assignment.device_uuids)
            for key, r in self.replicas.items()
            if r.observed is not None and r.observed.status == RUNNING
        }
        per_process = dict(usage)  # NVML's per-process figures, before any device totals
        usage = with_device_totals(usage, telemetry, foreign, running)
        for key, r in self.replicas.items():
            if r.isolation in SHIM_MODES and r.shim_snapshot is not None:
                usage[key] = shim_usage_mib(r.shim_snapshot)  # exact, from the region
                self._cross_check_shim(key, r, usage[key], per_process.get(key, {}))
        watched = []
        for key, r in self.replicas.items():
            if r.observed is None or r.observed.status != RUNNING:
                continue
            watched.append(
                WatchedReplica(
                    key=key,
                    device_uuids=tuple(r.assignment.device_uuids),
                    memory_limit_mib=r.assignment.memory_mib_per_device,
                    usage_mib=usage.get(key, {}),
                    priority=r.assignment.priority,
                    preemptible=r.assignment.preemptible,
                    watched=r.isolation == "soft",
                    stopping=self.executor.is_stopping(key),
                    reserve_mib=max(
                        (self._reserve.get(u, 0) for u in r.assignment.device_uuids), default=0
                    ),
                )
            )
        for verdict in self.watchdog.check(now, watched):
            replica = self.replicas[verdict.key]
            if verdict.action is Action.SIGNAL:
                # If the job ends on this signal, it ended because of its memory.
                replica.local_reason = verdict.reason
                replica.local_stop = "memory"
                self._save_assignment(verdict.key, replica)
                self.executor.signal(verdict.key, replica.assignment.checkpoint_signal)
            else:
                self._local_stop(verdict.key, "memory", verdict.reason, "SIGKILL", 0.0)
        memory = {
            s.uuid: (s.memory_used_mib, s.memory_usable_mib)
            for s in telemetry.devices
            if s.memory_used_mib is not None and not s.lost
        }
        pressured = frozenset(
            k
            for k, r in self.replicas.items()
            if r.local_reason
            and "pressure" in r.local_reason
            and r.observed is not None
            and r.observed.status == RUNNING
        )
        for verdict in pressure_victims(memory, watched, self.config.pressure_threshold, pressured):
            a = self.replicas[verdict.key].assignment
            self._local_stop(
                verdict.key, "pressure", verdict.reason, a.checkpoint_signal, a.grace_period_s
            )

    def _cross_check_shim(
        self, key: str, r: Replica, region_mib: Mapping[str, int], nvml_mib: Mapping[str, int]
    ) -> None:
        """Say (once) when NVML's per-process memory of a shim replica exceeds what its region
        holds by more than a context: the job may have written its own usage slots, or a
        process of it allocates around the shim."""
        if r.underreport_said:
            return
        slack = max((self._reserve.get(u, 0) for u in r.assignment.device_uuids), default=0)
        for uuid, seen in nvml_mib.items():
            held = region_mib.get(uuid, 0)
            if seen <= held + slack + UNDERREPORT_MARGIN_MIB:
                continue
            r.underreport_said = True
            r.isolation_reason = (
                f"NVML lists {seen} MiB for its processes on {uuid} but its CUDA shim region "
                f"holds {held} MiB: a process allocates around the shim or rewrote its usage"
            )
            self._save_assignment(key, r)
            log.warning("%s: %s", key, r.isolation_reason)
            return

    def _local_stop(self, key: str, reason: str, text: str, signal: str, grace: float) -> None:
        replica = self.replicas[key]
        if self.executor.is_stopping(key):
            return
        replica.local_reason = text
        replica.local_stop = reason
        self._save_assignment(key, replica)
        self.executor.stop(key, reason=reason, signal_name=signal, grace_s=grace)

    def _track_gpu_processes(self, telemetry: Telemetry) -> dict[str, dict[int, str]]:
        """Note each running replica's GPU processes; returns what NVML lists per device.

        The result maps a device UUID to ``{pid: replica key or ""}``.
        """
        leaders = {
            r.observed.pid: key
            for key, r in self.replicas.items()
            if r.observed is not None and r.observed.pid is not None
        }
        listed: dict[str, dict[int, str]] = {}
        for pid, key, uuid in pids_on_devices(telemetry, leaders):
            listed.setdefault(uuid, {})[pid] = key
            if key:
                self.replicas[key].gpu_pids.add(pid)
        return listed

    def _release(self, key: str, r: Replica, listed: dict[str, dict[int, str]]) -> bool:
        """True while an ended replica's slices must stay held (NVML lists its processes)."""
        if r.released or not r.assignment.device_uuids:
            return False
        seen = r.observed
        pids = set(r.gpu_pids) | ({seen.pid} if seen is not None and seen.pid else set())
        lingering = {
            uuid: sorted(pids & set(listed.get(uuid, {})))
            for uuid in r.assignment.device_uuids
            if pids & set(listed.get(uuid, {}))
        }
        if not lingering:
            r.released = True
            return False
        now = self.clock.monotonic()
        if r.held_since is None:
            r.held_since = now
            log.info("%s ended; waiting for NVML to release its GPU memory", key)
        r.gpu_pids.update(self.executor.kill_leftovers(key))
        if now - r.held_since < self.config.release_wait_s:
            return True
        r.released = True
        for uuid, stuck in lingering.items():
            self._stuck.setdefault(uuid, set()).update(stuck)
            log.warning(
                "%s: processes %s of ended job %s still hold GPU memory after %.0fs",
                uuid,
                stuck,
                key,
                self.config.release_wait_s,
            )
        return False

    def _mps_tenants(self, uid: int | None = None) -> list[mpsplan.MpsTenant]:
        """Live replicas under MPS (of ``uid`` only, when given)."""
        return [
            mpsplan.MpsTenant(
                r.uid,
                tuple(r.assignment.device_uuids),
                r.assignment.milli_per_device,
                r.assignment.memory_mib_per_device,
            )
            for r in self.replicas.values()
            if r.isolation in MPS_MODES
            and r.uid is not None
            and (uid is None or r.uid == uid)
            and (r.observed is None or r.observed.status in (STARTING, RUNNING))
        ]

    def _limit_mps_server(self, replica: Replica) -> str | None:
        """Set the limits of the MPS server ``replica`` will attach to; what failed, if any."""
        assert self.mps is not None
        assert replica.uid is not None
        a = replica.assignment
        new = mpsplan.MpsTenant(
            replica.uid, tuple(a.device_uuids), a.milli_per_device, a.memory_mib_per_device
        )
        percentage, memory = mpsplan.server_limits([*self._mps_tenants(replica.uid), new], new.uid)
        return self.mps.limit(new.uid, percentage, memory)

    def _check_mps_attached(self, listed: dict[str, dict[int, str]]) -> None:
        """An MPS replica whose GPU processes are no server's clients runs without MPS."""
        if self.mps is None:
            return
        clients: set[int] | None = None
        for key, r in self.replicas.items():
            if r.isolation not in MPS_MODES or r.mps_verified:
                continue
            mine = {pid for per in listed.values() for pid, owner in per.items() if owner == key}
            if not mine:
                continue  # CUDA not started yet
            if clients is None:
                clients = self.mps.clients()
            if mine & clients:
                r.mps_verified = True
                continue
            if r.isolation == "mps+shim":  # the shim's memory limit holds; it paces instead
                r.isolation = "shim"
                still = "the CUDA shim's memory limit holds and it now paces the compute share"
                region = self._region(r.shim_region) if r.shim_region is not None else None
                if region is not None:
                    for uuid in r.assignment.device_uuids:
                        region.set_share(uuid, max(1, min(1000, r.assignment.milli_per_device)))
            else:
                r.isolation = "soft"  # what still holds: the framework caps and the watchdog
                still = "watched as soft isolation"
            r.local_reason = (
                f"running without MPS: its GPU processes {sorted(mine)} are no MPS server's "
                "clients (the daemon restarted, or its pipe was unreachable), so no MPS limit "
                f"holds; {still}"
            )
            r.isolation_reason = r.local_reason
            self._save_assignment(key, r)
            log.warning("%s: %s", key, r.local_reason)

    def _stuck_verdicts(
        self, verdicts: dict[str, HealthVerdict], listed: dict[str, dict[int, str]]
    ) -> dict[str, HealthVerdict]:
        """Devices held by processes of ended jobs are unhealthy until NVML lets them go."""
        for uuid in list(self._stuck):
            self._stuck[uuid] &= set(listed.get(uuid, {}))
            if not self._stuck[uuid]:
                del self._stuck[uuid]
                continue
            pids = ", ".join(str(p) for p in sorted(self._stuck[uuid]))
            verdicts[uuid] = HealthVerdict(
                uuid,
                DeviceHealth.UNHEALTHY,
                f"processes {pids} of an ended job still hold its memory (NVML lists them "
                f"{self.config.release_wait_s:.0f}s after the job ended): no new work until "
                "they are gone",
            )
        return verdicts

    # ------------------------------------------------------------------ the CUDA shim

    @staticmethod
    def _shim_region_of(env: Mapping[str, str]) -> str | None:
        path = ShimIsolation.region_path(env)
        return str(path) if path is not None else None

    def _reported_isolation(self, r: Replica) -> str | None:
        """``shim`` only once a process attached to the region; nothing before."""
        if r.isolation in SHIM_MODES and not r.shim_attached:
            return None
        return r.isolation

    def _region(self, path: str) -> Region | None:
        region = self._regions.get(path)
        if region is None:
            try:
                region = Region.open(Path(path))
            except RegionError as exc:
                log.warning("%s", exc)
                return None
            self._regions[path] = region
        return region

    def _read_shim_regions(self, listed: dict[str, dict[int, str]]) -> None:
        """Reap, read usage and check attachment for every running shim replica."""
        now = self.clock.monotonic()
        for key, r in self.replicas.items():
            if (
                r.isolation not in SHIM_MODES
                or r.shim_region is None
                or r.observed is None
                or r.observed.status != RUNNING
            ):
                continue
            region = self._region(r.shim_region)
            if region is None:
                continue
            try:
                region.reap()
                r.shim_snapshot = region.read()
            except RegionError as exc:
                log.warning("%s: %s", key, exc)
                continue
            if r.running_since is None:
                r.running_since = now
            if r.shim_snapshot.attached and not r.shim_attached:
                r.shim_attached = True
                self._save_assignment(key, r)
            on_gpu = sorted(
                {pid for per in listed.values() for pid, owner in per.items() if owner == key}
            )
            if r.shim_attached:
                # For its whole life: a GPU process that never attaches while others did.
                stray = self._unattached(r, on_gpu, now)
                if not stray:
                    continue
                why = f"its GPU processes {stray} use the GPU"
            else:
                if on_gpu and r.listed_since is None:
                    r.listed_since = now
                waited_listed = r.listed_since is not None and (
                    now - r.listed_since >= self.config.shim_attach_wait_s
                )
                waited_long = now - r.running_since >= self.config.shim_attach_deadline_s
                if not (waited_listed or waited_long):
                    continue
                why = (
                    f"its GPU processes {on_gpu} use the GPU"
                    if on_gpu
                    else f"it has run {self.config.shim_attach_deadline_s:.0f}s"
                )
            # What still holds: MPS where it served it too, else the NVML watchdog.
            r.isolation = "mps" if r.isolation == "mps+shim" else "soft"
            still = (
                "MPS's limits still hold" if r.isolation == "mps" else "watched as soft isolation"
            )
            who = "they never attached" if r.shim_attached else "none of its processes attached"
            r.local_reason = (
                f"running without the CUDA shim: {why} but {who} to "
                "its slice region (a static binary, a cleared environment or a reset "
                f"LD_LIBRARY_PATH bypasses the shim), so no shim limit holds; {still}"
            )
            r.isolation_reason = r.local_reason
            self._save_assignment(key, r)
            log.warning("%s: %s", key, r.local_reason)

    def _unattached(self, r: Replica, on_gpu: list[int], now: float) -> list[int]:
        """GPU processes of an attached replica that stayed unattached ``shim_attach_wait_s``
        (a process attaches at its first CUDA use, before NVML can list it)."""
        attached = set(r.shim_snapshot.attached_pids) if r.shim_snapshot is not None else set()
        stray = [pid for pid in on_gpu if pid not in attached]
        r.unattached_since = {pid: r.unattached_since.get(pid, now) for pid in stray}
        wait = self.config.shim_attach_wait_s
        return [pid for pid, since in r.unattached_since.items() if now - since >= wait]

    def _end_shim(self, r: Replica) -> None:
        """A replica's processes are gone: keep the region's last figures, delete it."""
        if r.shim_region is None:
            return
        region = self._regions.pop(r.shim_region, None)
        if region is not None:
            with contextlib.suppress(RegionError):
                region.reap()
                r.shim_snapshot = region.read()
            region.close()
        ShimIsolation.release({"GPUPOOL_CUDA_REGION": r.shim_region})


def shim_spilled(r: Replica) -> dict[str, int] | None:
    """Bytes per device a shim replica's processes hold in host memory (spill), as last read."""
    if r.shim_snapshot is None or r.isolation not in SHIM_MODES:
        return None
    return {d.uuid: d.spilled_bytes for d in r.shim_snapshot.devices}


def shim_usage_mib(snapshot: RegionSnapshot) -> dict[str, int]:
    """A shim replica's memory per device (MiB, rounded up) as its region counts it."""
    return {d.uuid: math.ceil(d.used_bytes / MIB) for d in snapshot.devices}
