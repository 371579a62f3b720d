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
from gpupool.store.models import EventModel, UsageModel
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


def test_two_replicas_of_one_job_on_one_device_add_up_in_one_row_across_an_hour(
    cp: ControlPlane, clock: ManualClock
) -> None:
    """Both halves of a gang on one GPU accrue into the job's one row per device and hour,
    each heartbeat adding to what the last one wrote, across an hour boundary."""
    register(cp, gpus=1)
    submit(cp, gpus="0.5", replicas=2)
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    placed_at = clock.now()
    loop.cycle()
    loop.leadership.release()
    starts = heartbeat(cp).start
    assert len(starts) == 2
    assert {s.device_uuids[0] for s in starts} == {"n1-gpu0"}
    sample = [DeviceTelemetry(uuid="n1-gpu0", utilization_ratio=0.5)]
    both = [running(s.assignment_id) for s in starts]
    clock.advance(3600 - clock.now() % 3600 - 600)  # 10 minutes before the hour
    heartbeat(cp, replicas=both, telemetry=sample)
    clock.advance(1200)  # into the next hour
    heartbeat(cp, replicas=both, telemetry=sample)
    clock.advance(1800)
    heartbeat(cp, replicas=[exited(s.assignment_id) for s in starts], telemetry=sample)
    with cp.read() as s:
        rows = list(s.scalars(select(UsageModel).order_by(UsageModel.bucket_start)))
    assert [r.bucket_start % 3600 for r in rows] == [0.0, 0.0]  # one row for each hour
    held = 2 * 500 * (clock.now() - placed_at)  # two half GPUs from placement to the end
    assert sum(r.milli_seconds for r in rows) == pytest.approx(held)
    assert sum(r.busy_milli_seconds for r in rows) == pytest.approx(held * 0.5)
    [line] = AccountingService(cp).report(ADMIN.principal, 0, clock.now() + 1)
    assert line.milli_seconds == pytest.approx(held)
