"""Device health from telemetry: lost GPUs, fatal XIDs, unreadable devices and overheating.

A device is **unhealthy** when the driver lost it, when it reported a fatal XID (the list below,
from NVIDIA's XID catalogue: errors that need a reset or a node drain, not the ones a buggy
program causes such as 13, 31 or 43), when NVML cannot read its memory (the watchdog and the
pressure rule would be blind on it), or when it is **overheating**.

Temperature: at the slowdown threshold a GPU throttles, which is slow, not broken: it stays
healthy and keeps taking work (the server raises a temperature alert from the reported
reading, and the agent logs it once). At the shutdown threshold it is unhealthy, and it stays
so until it has cooled below the slowdown threshold (hysteresis: a GPU hovering around its
shutdown threshold does not flap between healthy and unhealthy). Without a reported shutdown
threshold, ``slowdown + SHUTDOWN_MARGIN_C`` stands in for it.

Lost and fatal-XID states are sticky until the agent restarts (an admin resets the GPU first);
overheating and unreadable memory clear when they pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu.base import DeviceInfo, DeviceSample, Telemetry

log = logging.getLogger("gpupool.gpu.health")
#: Degrees above the slowdown threshold that stand for a shutdown threshold NVML did not give.
SHUTDOWN_MARGIN_C = 5.0

#: XIDs after which a device must not take new work, with what they mean.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (reset needed)",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


@dataclass(frozen=True)
class HealthVerdict:
    """A device's health and, when not healthy, why (for people and the server's event log)."""

    uuid: str
    health: DeviceHealth
    reason: str | None = None
    last_xid: int | None = None


class HealthTracker:
    """Folds successive telemetry into a verdict per device."""

    def __init__(self, inventory: tuple[DeviceInfo, ...]) -> None:
        self._inventory = {d.uuid: d for d in inventory}
        self._sticky: dict[str, str] = {}
        self._last_xid: dict[str, int] = {}
        self._overheated: set[str] = set()
        self._throttling: set[str] = set()

    def set_inventory(self, inventory: tuple[DeviceInfo, ...]) -> None:
        """The devices to expect from now on (sticky states of the others are kept)."""
        self._inventory = {d.uuid: d for d in inventory}

    def update(self, telemetry: Telemetry) -> dict[str, HealthVerdict]:
        for event in telemetry.xid_events:
            self._last_xid[event.uuid] = event.xid
            if event.xid in FATAL_XIDS and event.uuid not in self._sticky:
                self._sticky[event.uuid] = f"fatal XID {event.xid}: {FATAL_XIDS[event.xid]}"
        verdicts: dict[str, HealthVerdict] = {}
        for sample in telemetry.devices:
            if sample.lost and sample.uuid not in self._sticky:
                self._sticky[sample.uuid] = "GPU lost (fallen off the bus or driver error)"
            reason = self._sticky.get(sample.uuid)
            if reason is None:
                reason = _unreadable(sample)
            if reason is None:
                reason = self._temperature(sample)
            verdicts[sample.uuid] = HealthVerdict(
                uuid=sample.uuid,
                health=DeviceHealth.HEALTHY if reason is None else DeviceHealth.UNHEALTHY,
                reason=reason,
                last_xid=self._last_xid.get(sample.uuid),
            )
        for uuid in self._inventory:
            if uuid not in verdicts:  # missing from the sample: the backend cannot see it
                verdicts[uuid] = HealthVerdict(
                    uuid, DeviceHealth.UNHEALTHY, "device missing from telemetry"
                )
        return verdicts

    def _temperature(self, sample: DeviceSample) -> str | None:
        """Why ``sample``'s device is too hot to use, or ``None``; logs throttling once."""
        info = self._inventory.get(sample.uuid)
        temp = sample.temperature_c
        if info is None or temp is None or info.slowdown_temp_c is None:
            return None
        slowdown = info.slowdown_temp_c
        shutdown = info.shutdown_temp_c or slowdown + SHUTDOWN_MARGIN_C
        uuid = sample.uuid
        if temp >= slowdown and uuid not in self._throttling:
            self._throttling.add(uuid)
            log.warning(
                "%s: %.0f°C, at or above its slowdown threshold %.0f°C: it throttles but keeps "
                "taking work",
                uuid,
                temp,
                slowdown,
            )
        elif temp < slowdown:
            self._throttling.discard(uuid)
        if temp >= shutdown:
            self._overheated.add(uuid)
        elif temp < slowdown:
            self._overheated.discard(uuid)
        if uuid not in self._overheated:
            return None
        return (
            f"temperature {temp:.0f}°C: it reached its shutdown threshold {shutdown:.0f}°C "
            f"and takes no work until it cools below {slowdown:.0f}°C"
        )


def _unreadable(sample: DeviceSample) -> str | None:
    failed = [c for c in sample.failed_calls if c.startswith("nvmlDeviceGetMemoryInfo")]
    if not failed:
        return None
    return f"NVML cannot read its memory ({failed[0]}): it cannot be watched"
