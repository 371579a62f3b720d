"""Nodes, devices, pools, tenants, quotas, priority classes, users and roles."""

from __future__ import annotations

import pytest

from gpupool.domain.errors import InvalidValue
from gpupool.domain.nodes import Device, Node, NodeState, allowed_model, matches_gpu_type
from gpupool.domain.pools import Pool, validate_name
from gpupool.domain.resources import ResourceRequest
from gpupool.domain.tenants import PriorityClass, Quota, Tenant
from gpupool.domain.users import PERMISSIONS, Permission, Role, User, allows


@pytest.mark.parametrize(
    ("model", "wanted", "ok"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb", True),
        ("NVIDIA A100-SXM4-80GB", "A10", False),
        ("NVIDIA A10", "A10", True),
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("Tesla T4", "T4", True),
        ("V100M32", "V100M32", True),
        ("V100M32", "V100", False),
        ("NVIDIA GeForce RTX 4090", "4090", True),
        ("anything", "", False),
    ],
)
def test_gpu_type_matching_by_words(model: str, wanted: str, ok: bool) -> None:
    assert matches_gpu_type(model, wanted) is ok


def test_allowed_model_with_no_constraint_is_any() -> None:
    assert allowed_model("T4", ())
    assert allowed_model("T4", ("A100", "T4"))
    assert not allowed_model("T4", ("A100",))


def test_resource_request_device_counts() -> None:
    assert ResourceRequest(gpu_milli=0).device_count == 0
    half = ResourceRequest(gpu_milli=500)
    assert (half.device_count, half.milli_per_device, half.is_fractional) == (1, 500, True)
    two = ResourceRequest(gpu_milli=2000)
    assert (two.device_count, two.milli_per_device, two.is_fractional) == (2, 1000, False)


def test_resource_memory_defaults_to_the_compute_share() -> None:
    assert ResourceRequest(gpu_milli=500).memory_on(81920) == 40960
    assert ResourceRequest(gpu_milli=2000).memory_on(81920) == 81920
    assert ResourceRequest(gpu_milli=250, gpu_memory_mib=1000).memory_on(81920) == 1000


def test_resource_request_rejects_partial_multi_gpu() -> None:
    with pytest.raises(InvalidValue, match="whole number of GPUs"):
        ResourceRequest(gpu_milli=1500)


def test_devices_and_nodes() -> None:
    dev = Device(uuid="GPU-1", node="n1", index=0, model="A100", memory_mib=81920)
    assert not dev.is_mig
    mig = Device(
        uuid="MIG-1", node="n1", index=0, model="A100", memory_mib=9856, mig_parent="GPU-1"
    )
    assert mig.is_mig
    assert Node("n1", 64000, 262144).schedulable
    assert not Node("n1", 64000, 262144, state=NodeState.DRAINING).schedulable


@pytest.mark.parametrize("name", ["default", "research", "a", "team-1"])
def test_valid_names(name: str) -> None:
    assert validate_name("pool", name) == name


@pytest.mark.parametrize("name", ["", "Research", "-x", "x-", "a_b", "a" * 65, "a b"])
def test_invalid_names_say_what_is_allowed(name: str) -> None:
    with pytest.raises(InvalidValue, match="lowercase letters"):
        validate_name("tenant", name)


def test_pool_overcommit_range_and_prices() -> None:
    pool = Pool(
        "research",
        memory_overcommit=1.5,
        price_per_gpu_hour=(("A100", 2.5),),
        default_price_per_gpu_hour=1.0,
    )
    assert pool.price_of("a100") == 2.5
    assert pool.price_of("T4") == 1.0
    with pytest.raises(InvalidValue, match=r"between 1\.0"):
        Pool("x", memory_overcommit=0.5)
    with pytest.raises(InvalidValue, match="negative"):
        Pool("x", price_per_gpu_hour=(("T4", -1.0),))


def test_quota_rules() -> None:
    Quota("vision", "default", guaranteed_milli=2000, limit_milli=4000)
    with pytest.raises(InvalidValue, match="below guaranteed"):
        Quota("vision", "default", guaranteed_milli=2000, limit_milli=1000)
    with pytest.raises(InvalidValue, match=">= 0"):
        Quota("vision", "default", guaranteed_milli=-1)
    with pytest.raises(InvalidValue, match="budget"):
        Quota("vision", "default", gpu_hour_budget=-5)


def test_tenant_and_priority_class_validation() -> None:
    assert Tenant("vision").fair_share == 1.0
    with pytest.raises(InvalidValue, match=r"out of range: use a number from 0\.001 to 1000000"):
        Tenant("vision", fair_share=0)
    with pytest.raises(InvalidValue, match="out of range"):
        PriorityClass("urgent", -1)


def test_roles_and_permissions() -> None:
    assert allows(Role.ADMIN, Permission.USER_MANAGE_ANY)
    assert not allows(Role.ADMIN, Permission.AGENT)
    assert allows(Role.AGENT, Permission.AGENT)
    assert PERMISSIONS[Role.AGENT] == {Permission.AGENT}
    assert allows(Role.MEMBER, Permission.JOB_SUBMIT)
    assert not allows(Role.MEMBER, Permission.JOB_CANCEL_TENANT)
    assert not allows(Role.VIEWER, Permission.JOB_SUBMIT)
    assert allows(Role.TENANT_ADMIN, Permission.JOB_CANCEL_TENANT)
    assert not allows(Role.TENANT_ADMIN, Permission.JOB_READ_ANY)
    assert set(PERMISSIONS) == set(Role)


def test_tenant_roles_need_a_tenant() -> None:
    with pytest.raises(ValueError, match="needs a tenant"):
        User("ann", Role.MEMBER)
    assert User("root", Role.ADMIN).tenant is None
