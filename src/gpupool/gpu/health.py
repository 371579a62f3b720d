"""Device health from telemetry: lost GPUs, fatal XIDs and overheating.

A device is **unhealthy** when the driver lost it, when it reported a fatal XID (the list below,
from NVIDIA's XID catalogue: errors that need a reset or a node drain, not the ones a buggy
program causes such as 13, 31 or 43), or while it runs at or above its slowdown temperature.
Lost and fatal-XID states are sticky until the agent restarts (an admin resets the GPU first);
overheating clears when the device cools down.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu.base import DeviceInfo, Telemetry

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
            info = self._inventory.get(sample.uuid)
            if (
                reason is None
                and info is not None
                and info.slowdown_temp_c is not None
                and sample.temperature_c is not None
                and sample.temperature_c >= info.slowdown_temp_c
            ):
                reason = (
                    f"temperature {sample.temperature_c:.0f}°C at or above its slowdown "
                    f"limit {info.slowdown_temp_c:.0f}°C"
                )
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
