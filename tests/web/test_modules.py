"""The dashboard's pure JavaScript functions, run in chromium as ES modules.

No Node.js toolchain is needed: the page imports the shipped modules and the test checks what
they return. These are the rules the views build on (parsing /metrics, pool arithmetic, CSV
quoting, who may cancel, number formatting).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.pool import LivePool

METRICS = r"""# HELP gpupool_gpu_utilization_ratio GPU utilisation from telemetry
# TYPE gpupool_gpu_utilization_ratio gauge
gpupool_gpu_utilization_ratio{device="GPU-a",model="A100",node="n1",pool="p"} 0.25
gpupool_gpu_utilization_ratio{device="GPU-b",model="A100",node="n1",pool="p"} 1.0
gpupool_gpu_compute_allocated_ratio{device="GPU-a",model="A100",node="n1",pool="p"} 0.75
gpupool_gpu_compute_allocated_ratio{device="GPU-b",model="A100",node="n1",pool="p"} 0.5
gpupool_gpu_temperature_celsius{device="GPU-a",model="A100",node="n1",pool="p"} 61.5
gpupool_gpu_healthy{device="GPU-b",model="A100",node="n1",pool="p"} 0.0
gpupool_mem_share_ratio{pool="p"} 1.25
gpupool_scheduler_queue{pool="p",tenant="t1"} 2.0
gpupool_scheduler_queue{pool="p",tenant="t2"} 3.0
gpupool_alerts{kind="temperature"} 1.0
gpupool_nodes{state="up \"quoted\""} 1.0
"""


@pytest.fixture
def modules(page: Any, pool: LivePool) -> Any:
    page.goto(f"{pool.url}/")
    page.wait_for_selector("#signin:not([hidden])")
    return page


def test_metrics_parse_into_device_telemetry_and_pool_figures(modules: Any) -> None:
    out = modules.evaluate(
        """async (text) => {
          const m = await import('/ui/js/metrics.js');
          const parsed = m.parseMetrics(text);
          const devices = m.deviceTelemetry(parsed);
          const pool = m.poolFigures(parsed, devices).get('p');
          return { a: devices.get('GPU-a'), b: devices.get('GPU-b'), pool,
            alerts: m.alertsInForce(parsed),
            quoted: parsed.get('gpupool_nodes')[0].labels.state };
        }""",
        METRICS,
    )
    assert out["a"]["util"] == 0.25
    assert out["a"]["computeAlloc"] == 0.75
    assert out["a"]["temp"] == 61.5
    assert out["b"]["healthy"] == 0
    pool = out["pool"]
    assert pool["gpus"] == 2
    assert pool["allocated"] == pytest.approx(1.25)
    assert pool["used"] == pytest.approx(1.25)
    # idle = allocated but unused, per device: a: 0.75-0.25, b: max(0, 0.5-1.0)
    assert pool["idle"] == pytest.approx(0.5)
    assert pool["free"] == pytest.approx(0.75)
    assert pool["memShare"] == 1.25
    assert pool["queue"] == 5
    assert pool["unhealthy"] == 1
    assert out["alerts"] == {"temperature": 1}
    assert out["quoted"] == 'up "quoted"'


def test_usage_csv_quotes_fields_and_keeps_the_column_order(modules: Any) -> None:
    csv = modules.evaluate(
        """async () => (await import('/ui/js/views/usage.js')).usageCsv([
          { key: { tenant: 'a,b', user: 'x"y', pool: 'p', gpu_model: 'T4' }, gpu_hours: 1.5,
            utilization_ratio: 0.5, idle_ratio: 0.5, cost: 2, jobs: 3, milli_seconds: 5400000,
            mib_seconds: 1, busy_milli_seconds: 2700000 }])"""
    )
    header, row = csv.split("\r\n")[:2]
    assert header.split(",")[:5] == ["tenant", "user", "pool", "gpu_model", "gpu_hours"]
    assert row.startswith('"a,b","x""y",p,T4,1.5,0.5,0.5,2,3,')


def test_cancel_is_offered_by_role_tenant_and_owner(modules: Any) -> None:
    out = modules.evaluate(
        """async () => {
          const { canCancel } = await import('/ui/js/views/job.js');
          const as = (role, perms, user, tenant) => ({ me: { role, user, tenant },
            can: (p) => perms.includes(p) });
          const job = { state: 'RUNNING', user: 'alice', tenant: 'a' };
          return {
            admin: canCancel(as('admin', ['job:cancel-any'], 'root', null), job),
            tenantAdmin: canCancel(as('tenant-admin', ['job:cancel-tenant'], 'ta', 'a'), job),
            otherTenantAdmin: canCancel(as('tenant-admin', ['job:cancel-tenant'], 'tb', 'b'), job),
            owner: canCancel(as('member', ['job:cancel-own'], 'alice', 'a'), job),
            teammate: canCancel(as('member', ['job:cancel-own'], 'dave', 'a'), job),
            viewer: canCancel(as('viewer', [], 'carol', 'a'), job),
            ended: canCancel(as('admin', ['job:cancel-any'], 'root', null),
              { ...job, state: 'COMPLETED' }),
          };
        }"""
    )
    assert out == {
        "admin": True,
        "tenantAdmin": True,
        "otherTenantAdmin": False,
        "owner": True,
        "teammate": False,
        "viewer": False,
        "ended": False,
    }


def test_hold_release_and_requeue_are_offered_by_state_and_right(modules: Any) -> None:
    out = modules.evaluate(
        """async () => {
          const { queueAction } = await import('/ui/js/views/job.js');
          const owner = { me: { role: 'member', user: 'alice', tenant: 'a' },
            can: (p) => p === 'job:cancel-own' };
          const viewer = { me: { role: 'viewer', user: 'carol', tenant: 'a' }, can: () => false };
          const job = (state, held) => ({ state, held, user: 'alice', tenant: 'a' });
          const cases = [[owner, 'PENDING', false], [owner, 'PENDING', true],
            [owner, 'RUNNING', false], [owner, 'FAILED', false], [owner, 'PREEMPTED', false],
            [owner, 'COMPLETED', false], [owner, 'CANCELLED', false],
            [viewer, 'PENDING', false], [viewer, 'FAILED', false]];
          return cases.map(([who, state, held]) => queueAction(who, job(state, held)));
        }"""
    )
    assert out == ["hold", "release", None, "requeue", "requeue", None, None, None, None]


def test_amounts_format_from_integer_milli_gpu_and_mib(modules: Any) -> None:
    out = modules.evaluate(
        """async () => {
          const d = await import('/ui/js/dom.js');
          const o = await import('/ui/js/views/overview.js');
          return [d.fmtGpus(500), d.fmtGpus(2000), d.fmtGpus(125), d.fmtMem(40960),
            d.fmtMem(512), d.fmtMem(1536), d.fmtPct(0.456), d.fmtDuration(3725),
            o.utilBucket(0), o.utilBucket(0.5), o.utilBucket(1), o.utilBucket(null)];
        }"""
    )
    assert out == ["0.5", "2", "0.125", "40 GiB", "512 MiB", "1.5 GiB", "46%", "1h 2m",
                   "0", "3", "5", "none"]  # fmt: skip
