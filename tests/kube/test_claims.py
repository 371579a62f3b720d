"""Reading a claim's allocation into the plugin's integers (pure)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpupool.kube.claims import ClaimError, claim_devices, quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", 10 << 30),
        ("500m", Fraction(1, 2)),
        ("1", 1),
        ("1.5", Fraction(3, 2)),
        ("2e3", 2000),
        ("100M", 100_000_000),
        ("23028Mi", 23028 << 20),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "ten", "10GB", "1..5", "5Xi"])
def test_a_bad_quantity_says_what_a_quantity_is(text: str) -> None:
    with pytest.raises(ClaimError, match="not a Kubernetes quantity"):
        quantity(text)


def _claim(results: list[dict]) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_only_this_drivers_devices_on_this_node_are_kept() -> None:
    claim = _claim(
        [
            {"request": "gpu", "driver": "gpu.gpupool.io", "pool": "n1", "device": "gpu-1",
             "shareID": "s1", "consumedCapacity": {"memory": "10Gi", "compute": "500"}},
            {"request": "nic", "driver": "nic.example.com", "pool": "n1", "device": "eth0"},
            {"request": "gpu", "driver": "gpu.gpupool.io", "pool": "n2", "device": "gpu-0"},
        ]
    )  # fmt: skip
    (device,) = claim_devices(claim, driver="gpu.gpupool.io", node="n1")
    assert (device.device, device.share_id) == ("gpu-1", "s1")
    assert (device.memory_bytes, device.compute_milli) == (10 << 30, 500)


def test_an_unshared_device_gets_all_of_it() -> None:
    claim = _claim([{"request": "gpus", "driver": "gpu.gpupool.io", "pool": "n1",
                     "device": "gpu-0"}])  # fmt: skip
    (device,) = claim_devices(claim, driver="gpu.gpupool.io", node="n1")
    assert (device.memory_bytes, device.compute_milli, device.share_id) == (None, 1000, None)


def test_an_unallocated_or_foreign_claim_is_refused_with_why() -> None:
    with pytest.raises(ClaimError, match="not allocated yet"):
        claim_devices({"metadata": {}, "status": {}}, driver="gpu.gpupool.io", node="n1")
    with pytest.raises(ClaimError, match=r"holds no gpu\.gpupool\.io device on node n9"):
        claim_devices(_claim([]), driver="gpu.gpupool.io", node="n9")
