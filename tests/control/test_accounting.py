"""Accounting from heartbeats, usage reports, telemetry alerts and the metrics they feed."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.clock import ManualClock
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.control.services.accounting import AccountingService
from gpupool.control.services.pools import PoolService
from gpupool.control.services.telemetry import read_sample
from gpupool.control.services.tenants import TenantService
from gpupool.domain.pools import Pool
from gpupool.domain.tenants import Tenant
from gpupool.domain.users import Role
from gpupool.scheduling.layout import DEFAULT_CONTEXT_RESERVE_MIB
from gpupool.schemas.agent import DeviceTelemetry
from gpupool.store.models import EventModel
from tests.control.builders import ADMIN, actor, exited, heartbeat, register, running, submit


def _run_one(
    cp: ControlPlane, clock: ManualClock, gpus: str, seconds: float, util: float, **kw: object
) -> str:
    job = submit(cp, gpus=gpus, **kw)  # type: ignore[arg-type]
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    loop.cycle()
    loop.leadership.release()
    start = heartbeat(cp).start[0]
    sample = [DeviceTelemetry(uuid=u, utilization_ratio=util) for u in start.device_uuids]
    heartbeat(cp, replicas=[running(start.assignment_id)], telemetry=sample)
    clock.advance(seconds)
    heartbeat(cp, replicas=[exited(start.assignment_id)], telemetry=sample)
    return job.id


def test_usage_records_allocation_utilisation_idle_share_and_cost(
    cp: ControlPlane, clock: ManualClock
) -> None:
    PoolService(cp).put(ADMIN, Pool("default", price_per_gpu_hour=(("A100-80GB", 2.0),)))
    register(cp)
    _run_one(cp, clock, "0.5", 3600, 0.25)
    [line] = AccountingService(cp).report(ADMIN.principal, clock.now() - 7200, clock.now() + 1)
    assert line.key == {"tenant": "default"}
    assert line.milli_seconds == pytest.approx(500 * 3600)
    # the half GPU's memory, less the context headroom the node's soft mode keeps outside it
    assert line.mib_seconds == pytest.approx((40960 - DEFAULT_CONTEXT_RESERVE_MIB) * 3600)
    assert line.gpu_hours == pytest.approx(0.5)
    assert line.utilization_ratio == pytest.approx(0.25)
    assert line.idle_ratio == pytest.approx(0.75)
    assert line.cost == pytest.approx(1.0)  # half a GPU for an hour at 2.0 per GPU-hour
    assert line.jobs == 1


def test_reports_group_by_tenant_user_pool_and_model_within_a_window(
    cp: ControlPlane, clock: ManualClock
) -> None:
    register(cp)
    TenantService(cp).put(ADMIN, Tenant("red"))
    _run_one(cp, clock, "1", 1800, 1.0)
    clock.advance(7200)
    _run_one(cp, clock, "0.5", 1800, 0.0, tenant="red")
    svc = AccountingService(cp)
    rows = svc.report(ADMIN.principal, 0, clock.now() + 1, ("tenant", "user", "pool", "gpu_model"))
    assert [(r.key["tenant"], r.gpu_hours) for r in rows] == [("default", 0.5), ("red", 0.25)]
    assert {r.key["gpu_model"] for r in rows} == {"A100-80GB"}
    recent = svc.report(ADMIN.principal, clock.now() - 3600, clock.now() + 1)
    assert [r.key["tenant"] for r in recent] == ["red"]
    # a tenant-scoped reader sees its own tenant only, whatever it asks for
    member = actor("m", Role.MEMBER, "red").principal
    mine = svc.report(member, 0, clock.now() + 1, ("tenant",), tenant="default")
    assert [r.key["tenant"] for r in mine] == ["red"]


def test_a_hot_or_failing_device_raises_one_alert_and_shows_in_metrics(cp: ControlPlane) -> None:
    register(cp)
    hot = [DeviceTelemetry(uuid="n1-gpu0", temperature_c=91.0, power_w=300.0)]
    heartbeat(cp, telemetry=hot)
    heartbeat(cp, telemetry=hot)  # still hot: no second alert
    heartbeat(cp, telemetry=[DeviceTelemetry(uuid="n1-gpu1", healthy=False, xid=79)])
    with cp.tx() as s:
        kinds = [e.kind for e in s.scalars(select(EventModel).order_by(EventModel.id))]
    assert kinds == ["alert.temperature", "alert.health"]
    sample = read_sample(cp)
    by_uuid = {d.uuid: d for d in sample.devices}
    assert by_uuid["n1-gpu0"].hot
    assert by_uuid["n1-gpu0"].power_w == 300.0
    assert not by_uuid["n1-gpu1"].healthy


def test_an_unhealthy_device_gets_no_new_work(cp: ControlPlane) -> None:
    register(cp, gpus=1)
    heartbeat(cp, telemetry=[DeviceTelemetry(uuid="n1-gpu0", healthy=False)])
    job = submit(cp)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert loop.cycle().started == ()
    loop.leadership.release()
    del job
