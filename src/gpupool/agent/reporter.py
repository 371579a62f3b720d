"""What the agent tells the server: device telemetry and replica states, as wire models.

Telemetry covers the registered devices (whole GPUs and MIG instances); a MIG instance is
unhealthy when its parent GPU is. A replica's report follows :class:`ReplicaState`: the
executor's observation, plus the reason the agent itself stopped it (watchdog, pressure) and
the isolation mode it enforced.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.agent.executor import Observed
from gpupool.agent.jobdir import BOOT_FAILED, EXITED, RUNNING
from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu.base import DeviceInfo, Telemetry
from gpupool.gpu.health import HealthVerdict
from gpupool.schemas.agent import (
    DeviceTelemetry,
    ReplicaState,
    ReplicaStatus,
    StopReason,
)

_STATES = {
    RUNNING: ReplicaState.RUNNING,
    EXITED: ReplicaState.EXITED,
    BOOT_FAILED: ReplicaState.BOOT_FAILED,
}


def device_telemetry(
    inventory: tuple[DeviceInfo, ...],
    telemetry: Telemetry,
    verdicts: Mapping[str, HealthVerdict],
    registered: list[str],
) -> list[DeviceTelemetry]:
    """One entry per registered device UUID."""
    samples = telemetry.by_uuid()
    parent_of = {m.uuid: d.uuid for d in inventory for m in d.mig_instances}
    out: list[DeviceTelemetry] = []
    for uuid in registered:
        sample = samples.get(uuid)
        verdict = verdicts.get(parent_of.get(uuid, uuid)) or verdicts.get(uuid)
        healthy = verdict is None or verdict.health is DeviceHealth.HEALTHY
        if sample is None or sample.lost:
            out.append(
                DeviceTelemetry(
                    uuid=uuid,
                    healthy=False if sample else healthy,
                    xid=verdict.last_xid if verdict else None,
                )
            )
            continue
        out.append(
            DeviceTelemetry(
                uuid=uuid,
                utilization_ratio=sample.utilization_ratio,
                memory_used_mib=sample.memory_used_mib,
                temperature_c=sample.temperature_c,
                power_w=sample.power_w,
                healthy=healthy,
                xid=verdict.last_xid if verdict else None,
            )
        )
    return out


def replica_status(
    observed: Observed,
    *,
    isolation: str | None,
    local_reason: str | None = None,
    local_stop: str | None = None,
    checkpoint_time: float | None = None,
    spilled_bytes: dict[str, int] | None = None,
) -> ReplicaStatus:
    """The wire report for one replica.

    ``local_stop`` is the stop reason of a signal the agent sent on its own (the watchdog's
    warning): a job that ends on it is reported as stopped for that reason.
    """
    state = _STATES.get(observed.status, ReplicaState.STARTING)
    stop_reason: StopReason | None = None
    if state is ReplicaState.EXITED:
        raw = observed.stop_reason or local_stop
        if raw is not None:
            try:
                stop_reason = StopReason(raw)
            except ValueError:
                stop_reason = StopReason.CANCEL
    reason = observed.reason
    if local_reason is not None and state is ReplicaState.EXITED:
        reason = local_reason if reason is None else f"{local_reason}; {reason}"
    return ReplicaStatus(
        assignment_id=observed.key,
        state=state,
        exit_code=observed.exit_code if state is ReplicaState.EXITED else None,
        signal=observed.signal if state is ReplicaState.EXITED else None,
        stop_reason=stop_reason,
        isolation=isolation,
        reason=reason[:2000] if reason else None,
        final=observed.final and state is ReplicaState.BOOT_FAILED,
        checkpoint_time=checkpoint_time,
        spilled_bytes=spilled_bytes,
    )
