"""A catalogue of GPU models, for simulated devices.

Figures come from NVIDIA's data sheets: memory as ``nvidia-smi`` shows it (MiB), streaming
multiprocessors, board power (TDP, watts), the slowdown temperature, idle power and
temperature, and the compute capability. They make simulated telemetry look like a real card's.

Names are matched case-insensitively; a short name without a memory size (``A100``) picks the
first entry of that family.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.errors import InvalidValue


@dataclass(frozen=True)
class GpuModel:
    """Fixed facts about one GPU model. Memory in MiB, power in W, temperatures in °C."""

    name: str
    full_name: str
    memory_mib: int
    sm_count: int
    tdp_w: float
    compute_capability: tuple[int, int]
    slowdown_temp_c: float = 87.0
    idle_power_w: float = 50.0
    idle_temp_c: float = 33.0
    sm_clock_mhz: int = 1410
    memory_clock_mhz: int = 1215
    mig_capable: bool = False


CATALOGUE: dict[str, GpuModel] = {
    m.name.lower(): m
    for m in (
        GpuModel(
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            81920,
            108,
            400.0,
            (8, 0),
            idle_power_w=60.0,
            sm_clock_mhz=1410,
            memory_clock_mhz=1593,
            mig_capable=True,
        ),
        GpuModel(
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            40960,
            108,
            400.0,
            (8, 0),
            idle_power_w=55.0,
            sm_clock_mhz=1410,
            memory_clock_mhz=1215,
            mig_capable=True,
        ),
        GpuModel(
            "H100-80GB",
            "NVIDIA H100 80GB HBM3",
            81559,
            132,
            700.0,
            (9, 0),
            idle_power_w=70.0,
            sm_clock_mhz=1980,
            memory_clock_mhz=2619,
            mig_capable=True,
        ),
        GpuModel(
            "H200",
            "NVIDIA H200",
            143771,
            132,
            700.0,
            (9, 0),
            idle_power_w=75.0,
            sm_clock_mhz=1980,
            memory_clock_mhz=3201,
            mig_capable=True,
        ),
        GpuModel(
            "L40S",
            "NVIDIA L40S",
            46068,
            142,
            350.0,
            (8, 9),
            idle_power_w=35.0,
            sm_clock_mhz=2520,
            memory_clock_mhz=9001,
        ),
        GpuModel(
            "L4",
            "NVIDIA L4",
            23034,
            58,
            72.0,
            (8, 9),
            idle_power_w=16.0,
            sm_clock_mhz=2040,
            memory_clock_mhz=6251,
        ),
        GpuModel(
            "A10",
            "NVIDIA A10",
            23028,
            72,
            150.0,
            (8, 6),
            idle_power_w=20.0,
            sm_clock_mhz=1695,
            memory_clock_mhz=6251,
        ),
        GpuModel(
            "A30",
            "NVIDIA A30",
            24576,
            56,
            165.0,
            (8, 0),
            idle_power_w=30.0,
            sm_clock_mhz=1440,
            memory_clock_mhz=1215,
            mig_capable=True,
        ),
        GpuModel(
            "V100-32GB",
            "Tesla V100-SXM2-32GB",
            32768,
            80,
            300.0,
            (7, 0),
            idle_power_w=40.0,
            sm_clock_mhz=1530,
            memory_clock_mhz=877,
        ),
        GpuModel(
            "V100-16GB",
            "Tesla V100-SXM2-16GB",
            16384,
            80,
            300.0,
            (7, 0),
            idle_power_w=40.0,
            sm_clock_mhz=1530,
            memory_clock_mhz=877,
        ),
        GpuModel(
            "T4",
            "Tesla T4",
            15360,
            40,
            70.0,
            (7, 5),
            idle_power_w=10.0,
            idle_temp_c=30.0,
            sm_clock_mhz=1590,
            memory_clock_mhz=5001,
        ),
        GpuModel(
            "RTX-4090",
            "NVIDIA GeForce RTX 4090",
            24564,
            128,
            450.0,
            (8, 9),
            idle_power_w=25.0,
            sm_clock_mhz=2520,
            memory_clock_mhz=10501,
        ),
    )
}


def lookup_model(name: str) -> GpuModel:
    """The catalogue entry for ``name`` (``A100-80GB``, ``t4``, ``A100``)."""
    key = name.strip().lower()
    if key in CATALOGUE:
        return CATALOGUE[key]
    for model_key, model in CATALOGUE.items():
        if model_key.split("-")[0] == key:
            return model
    known = ", ".join(m.name for m in CATALOGUE.values())
    raise InvalidValue(
        f"unknown GPU model {name!r}: use one of {known}, or describe it in a YAML file",
        field="simulate",
    )
