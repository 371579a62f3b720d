"""GPU backends without a GPU: the simulated backend and the NVML backend over a fake NVML."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.errors import InvalidValue
from gpupool.domain.nodes import DeviceHealth
from gpupool.gpu import open_backend
from gpupool.gpu.base import GpuUnavailable, SyntheticLoad, Telemetry, Workload
from gpupool.gpu.health import HealthTracker
from gpupool.gpu.nvml import NvmlBackend
from gpupool.gpu.simulated import (
    SimulatedBackend,
    parse_simulate_spec,
    parse_synthetic_load,
)
from tests.agent.fake_nvml import FakeNvml

# ---------------------------------------------------------------- simulated


def test_spec_builds_devices_with_real_model_data() -> None:
    backend = SimulatedBackend.from_spec("4xA100-80GB,2xT4", node="n1")
    inv = backend.inventory()
    assert [d.index for d in inv] == list(range(6))
    assert inv[0].memory_mib == 81920
    assert inv[0].sm_count == 108
    assert inv[0].power_limit_w == 400
    assert inv[4].name == "Tesla T4"
    assert inv[4].memory_mib == 15360
    assert inv[0].compute_capability == (8, 0)
    assert len({d.uuid for d in inv}) == 6
    assert all(d.uuid.startswith("GPU-") for d in inv)
    # the four SXM A100s form one NVLink mesh; the T4s have no NVLink
    assert set(inv[0].nvlink_peers) == {inv[1].uuid, inv[2].uuid, inv[3].uuid}
    assert inv[4].nvlink_peers == ()


def test_uuids_differ_between_nodes_and_repeat_for_one_node() -> None:
    a = SimulatedBackend.from_spec("2xT4", node="a").inventory()
    a2 = SimulatedBackend.from_spec("2xT4", node="a").inventory()
    b = SimulatedBackend.from_spec("2xT4", node="b").inventory()
    assert [d.uuid for d in a] == [d.uuid for d in a2]
    assert not {d.uuid for d in a} & {d.uuid for d in b}


@pytest.mark.parametrize("bad", ["", "4xB999", "x", "0xT4", "4 A100"])
def test_bad_spec_says_how_to_write_it(bad: str) -> None:
    with pytest.raises(InvalidValue) as err:
        parse_simulate_spec(bad)
    assert "A100" in str(err.value) or "1 to 64" in str(err.value)


def test_yaml_file_with_custom_model_and_seed(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "seed: 7\ndevices:\n  - {model: A100-80GB, count: 2}\n"
        "  - {name: Lab GPU, memory: 24GiB, sm_count: 48, tdp_w: 200}\n"
    )
    backend = SimulatedBackend.from_spec(str(path), node="n")
    inv = backend.inventory()
    assert [d.name for d in inv] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["Lab GPU"]
    assert inv[2].memory_mib == 24576
    assert inv[2].power_limit_w == 200


def test_idle_devices_report_idle_telemetry() -> None:
    backend = SimulatedBackend.from_spec("1xA100-80GB", node="n")
    s = backend.sample().devices[0]
    assert s.utilization_ratio == 0.0
    assert s.memory_used_mib == 0
    assert s.power_w is not None
    assert s.power_w < 100


def test_telemetry_follows_the_jobs_placed() -> None:
    backend = SimulatedBackend.from_spec("2xA100-80GB", node="n", seed=3)
    uuid = backend.inventory()[0].uuid
    backend.set_workload(
        [
            Workload("j1", (uuid,), milli=500, memory_mib=40960, pids=(11,)),
            Workload("j2", (uuid,), 250, 10240, (12,), SyntheticLoad(0.1, 1000)),
        ]
    )
    s0, s1 = backend.sample().devices
    # default load: 0.9 of the 0.5 share + declared 0.1, within the noise
    assert s0.utilization_ratio == pytest.approx(0.55, abs=0.021)
    assert s0.memory_used_mib == int(40960 * 0.8) + 1000
    assert {p.pid: p.used_memory_mib for p in s0.processes} == {11: 32768, 12: 1000}
    assert s0.power_w is not None
    assert s1.power_w is not None
    assert s0.power_w > s1.power_w
    assert s1.utilization_ratio == 0.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), milli=st.integers(1, 1000))
def test_samples_are_deterministic_under_a_seed(seed: int, milli: int) -> None:
    def run() -> list[Telemetry]:
        b = SimulatedBackend.from_spec("2xH100-80GB", node="n", seed=seed)
        b.set_workload([Workload("j", (b.inventory()[1].uuid,), milli, 8000)])
        return [b.sample() for _ in range(3)]

    first, second = run(), run()
    assert first == second
    for t in first:
        for d in t.devices:
            assert d.utilization_ratio is not None
            assert 0.0 <= d.utilization_ratio <= 1.0
            assert d.memory_used_mib is not None
            assert d.memory_used_mib <= d.memory_total_mib


def test_synthetic_load_parsing() -> None:
    assert parse_synthetic_load("util=0.7,mem=4GiB") == SyntheticLoad(0.7, 4096)
    assert parse_synthetic_load("mem=512MiB") == SyntheticLoad(None, 512)
    with pytest.raises(InvalidValue, match="ratio"):
        parse_synthetic_load("util=7")
    with pytest.raises(InvalidValue, match="unknown key"):
        parse_synthetic_load("watts=3")


def test_lost_gpu_and_fatal_xid_make_devices_unhealthy() -> None:
    backend = SimulatedBackend.from_spec("3xT4", node="n")
    a, b, c = (d.uuid for d in backend.inventory())
    tracker = HealthTracker(backend.inventory())
    assert all(v.health is DeviceHealth.HEALTHY for v in tracker.update(backend.sample()).values())
    backend.lose(a)
    backend.inject_xid(b, 13)  # an application error: not the device's fault
    backend.inject_xid(c, 48)  # double-bit ECC error: fatal
    verdicts = tracker.update(backend.sample())
    assert verdicts[a].health is DeviceHealth.UNHEALTHY
    assert "fallen off the bus" in (verdicts[a].reason or "")
    assert verdicts[b].health is DeviceHealth.HEALTHY
    assert verdicts[b].last_xid == 13
    assert verdicts[c].health is DeviceHealth.UNHEALTHY
    assert "48" in (verdicts[c].reason or "")
    # fatal states stay after the event has passed
    assert tracker.update(backend.sample())[c].health is DeviceHealth.UNHEALTHY


# ---------------------------------------------------------------- NVML over a fake


def test_nvml_inventory_reads_identity_mig_and_nvlink() -> None:
    fake = FakeNvml()
    backend = NvmlBackend(nvml=fake)
    a, b = backend.inventory()
    assert (a.uuid, a.index, a.memory_mib, a.compute_capability) == ("GPU-aaaa", 0, 81920, (8, 0))
    assert a.pci_bus_id == "00000000:3B:00.0"
    assert a.power_limit_w == 400.0
    assert a.slowdown_temp_c == 87.0
    assert a.sm_count is None
    assert a.mig_enabled is False
    assert a.mig_instances == ()
    assert a.nvlink_peers == ("GPU-bbbb",)
    assert b.nvlink_peers == ("GPU-aaaa",)
    assert b.mig_enabled is True
    (mig,) = b.mig_instances
    assert (mig.uuid, mig.parent_uuid, mig.profile, mig.memory_mib) == (
        "MIG-cccc",
        "GPU-bbbb",
        "3g.40gb",
        40960,
    )
    assert mig.sm_count == 42
    backend.close()
    assert fake.shutdown_called


def test_nvml_sample_has_readings_processes_and_none_for_unsupported() -> None:
    fake = FakeNvml()
    fake.not_supported.add("nvmlDeviceGetPowerUsage")
    backend = NvmlBackend(nvml=fake)
    telemetry = backend.sample()
    by = telemetry.by_uuid()
    a = by["GPU-aaaa"]
    assert a.utilization_ratio == pytest.approx(0.42)
    assert a.memory_used_mib == 10240
    assert a.temperature_c == 55.0
    assert a.power_w is None  # not supported: None, never 0
    assert (a.sm_clock_mhz, a.memory_clock_mhz) == (1410, 1593)
    assert [(p.pid, p.used_memory_mib) for p in a.processes] == [(4242, 2048), (4343, None)]
    mig = by["MIG-cccc"]
    assert mig.memory_used_mib == 1024
    assert mig.utilization_ratio is None


def test_nvml_lost_gpu_and_xid_events() -> None:
    fake = FakeNvml()
    backend = NvmlBackend(nvml=fake)
    fake.gpus[0].lost = True
    fake.events = [(1, 79), (1, 31)]
    telemetry = backend.sample()
    assert telemetry.by_uuid()["GPU-aaaa"].lost
    assert [(e.uuid, e.xid) for e in telemetry.xid_events] == [("GPU-bbbb", 79), ("GPU-bbbb", 31)]
    assert backend.sample().xid_events == ()  # drained


def test_no_driver_is_one_clear_line() -> None:
    with pytest.raises(GpuUnavailable) as err:
        NvmlBackend(nvml=FakeNvml(driver=False))
    message = str(err.value)
    assert "\n" not in message
    assert "--simulate" in message


def test_open_backend_falls_back_to_simulation_only_when_asked() -> None:
    # This machine has no NVIDIA driver (GPU tests live in tests/gpu/).
    pytest.importorskip("pynvml")
    try:
        NvmlBackend()
    except GpuUnavailable:
        pass
    else:  # pragma: no cover - a GPU machine
        pytest.skip("a real driver is present")
    with pytest.raises(GpuUnavailable):
        open_backend(node="n")
    assert open_backend(node="n", fallback="2xT4").name == "simulated"
    assert len(open_backend(node="n", simulate="3xL4").inventory()) == 3
