"""Views with resources: a job's slices, a device's slices and latest telemetry, and the
tenant isolation of both (another tenant's slice is shown without its job or tenant)."""

from __future__ import annotations

import pytest

from gpupool.control.context import ControlPlane
from gpupool.control.machinery.loop import SchedulingLoop
from gpupool.schemas.agent import DeviceTelemetry
from tests.api.helpers import Api, make_api
from tests.control.builders import heartbeat, register


@pytest.fixture
def api(cp: ControlPlane) -> Api:
    return make_api(cp)


def _placed(api: Api, cp: ControlPlane) -> tuple[str, str]:
    """A red job and a blue job, both placed on node n1 (one device, 0.25 GPU each)."""
    register(cp, "n1", gpus=1)
    red = api.submit(
        api.tokens["member"], "red-job", resources={"gpus": "0.25", "gpu_memory": "1GiB"}
    )
    blue = api.submit(api.blue_member, "blue-job", resources={"gpus": "0.25", "gpu_memory": "2GiB"})
    loop = SchedulingLoop(cp)
    assert loop.leadership.try_acquire()
    assert set(loop.cycle().started) == {red, blue}
    return red, blue


def test_a_placed_job_lists_its_slices_with_replica_node_device_and_amounts(
    api: Api, cp: ControlPlane
) -> None:
    red, _blue = _placed(api, cp)
    job = api.call(api.tokens["member"], "GET", f"/v1/jobs/{red}").json()
    assert job["slices"] == [
        {
            "replica": 0,
            "node": "n1",
            "device_uuid": "n1-gpu0",
            "milli": 250,
            "memory_mib": 1024,
            "spilled_bytes": 0,
        }
    ]
    listed = api.call(api.tokens["member"], "GET", "/v1/jobs").json()["jobs"]
    assert [j["slices"] for j in listed if j["id"] == red] == [job["slices"]]


def test_a_pending_job_has_no_slices(api: Api) -> None:
    job_id = api.submit(api.tokens["member"], "waiting")
    assert api.call(api.tokens["member"], "GET", f"/v1/jobs/{job_id}").json()["slices"] == []


def test_device_slices_hide_the_job_and_tenant_of_other_tenants(api: Api, cp: ControlPlane) -> None:
    red, blue = _placed(api, cp)
    (device,) = api.call(api.tokens["member"], "GET", "/v1/devices").json()
    assert sorted(device["slices"], key=lambda x: x["milli"] + x["memory_mib"]) == [
        {"job_id": red, "tenant": "red", "milli": 250, "memory_mib": 1024},
        {"job_id": None, "tenant": None, "milli": 250, "memory_mib": 2048},
    ]
    (admin_view,) = api.as_admin("GET", "/v1/devices")
    assert {x["job_id"] for x in admin_view["slices"]} == {red, blue}
    node = api.call(api.tokens["viewer"], "GET", "/v1/nodes/n1").json()
    assert {x["job_id"] for x in node["devices"][0]["slices"]} == {red, None}


def test_device_views_carry_the_latest_telemetry_or_none_when_unknown(
    api: Api, cp: ControlPlane
) -> None:
    register(cp, "n1", gpus=2)
    (unknown, _) = api.as_admin("GET", "/v1/devices")
    assert unknown["utilization_ratio"] is None
    assert unknown["sampled_at"] is None
    sample = DeviceTelemetry(
        uuid="n1-gpu0",
        utilization_ratio=0.75,
        memory_used_mib=4096,
        temperature_c=61.0,
        power_w=250.0,
    )
    heartbeat(cp, "n1", telemetry=[sample])
    first, second = api.as_admin("GET", "/v1/devices")
    assert (first["utilization_ratio"], first["memory_used_mib"]) == (0.75, 4096)
    assert (first["temperature_c"], first["power_w"]) == (61.0, 250.0)
    assert first["sampled_at"] == cp.now()
    assert second["utilization_ratio"] is None


def test_fair_share_standing_follows_the_schedulers_factor() -> None:
    from gpupool.control.services.tenants import standings

    got = standings({"red": 1.0, "blue": 1.0}, {"red": 3000.0, "blue": 1000.0})
    assert got["red"].factor == pytest.approx(2.0**-1.5)
    assert got["blue"].factor == pytest.approx(2.0**-0.5)
    assert got["red"].usage_milli_s == 3000.0
    assert standings({"red": 2.0}, {})["red"].factor == 1.0


def test_tenant_views_carry_usage_and_factor_for_visible_tenants_only(api: Api) -> None:
    mine = api.call(api.tokens["member"], "GET", "/v1/tenants").json()
    assert [(t["name"], t["fair_share_factor"], t["decayed_usage_milli_s"]) for t in mine] == [
        ("red", 1.0, 0.0)
    ]
    one = api.call(api.tokens["member"], "GET", "/v1/tenants/red").json()
    assert one["fair_share_factor"] == 1.0
