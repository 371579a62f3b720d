"""Parsers and formatters for what people type: GPUs, memory, CPUs, durations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.domain.errors import InvalidValue
from gpupool.domain.units import (
    bytes_to_mib,
    format_cpus,
    format_duration,
    format_gpus,
    format_memory,
    mib_to_bytes,
    parse_cpus,
    parse_duration,
    parse_gpus,
    parse_memory,
)


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("0.5", 500),
        ("50%", 500),
        ("500m", 500),
        ("500M", 500),
        ("1", 1000),
        ("2", 2000),
        (" 0.25 ", 250),
        (".3", 300),
        ("0", 0),
        ("1.0", 1000),
        ("8", 8000),
        ("100%", 1000),
        ("1m", 1),
        (0.5, 500),
        (2, 2000),
    ],
)
def test_parse_gpus_accepts_what_people_type(text: object, milli: int) -> None:
    assert parse_gpus(text) == milli


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1.5", "not a whole number of GPUs"),
        ("half", "is not a GPU amount"),
        ("0.0005", "finer than 1/1000"),
        ("-1", "is not a GPU amount"),
        ("", "is not a GPU amount"),
        ("2 gpus", "is not a GPU amount"),
        ("150%", "not a whole number of GPUs"),
    ],
)
def test_parse_gpus_rejects_with_a_hint(text: str, fragment: str) -> None:
    with pytest.raises(InvalidValue) as info:
        parse_gpus(text)
    assert fragment in str(info.value)
    assert "use" in str(info.value) or "round" in str(info.value) or "ask" in str(info.value)


def test_parse_gpus_rejects_booleans() -> None:
    with pytest.raises(InvalidValue):
        parse_gpus(True)


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("10GiB", 10240),
        ("10240MiB", 10240),
        ("10G", 10240),
        ("10GB", 10240),
        ("10gib", 10240),
        ("1.5TiB", 1572864),
        ("0", 0),
        ("512M", 512),
        ("0.5GiB", 512),
        ("2048KiB", 2),
        ("80 GiB", 81920),
    ],
)
def test_parse_memory_accepts_common_forms(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


def test_parse_memory_error_names_the_fix() -> None:
    with pytest.raises(InvalidValue) as info:
        parse_memory("10 gigs", field="gpu memory")
    assert str(info.value) == (
        "gpu memory '10 gigs' has an unknown unit 'gigs': use 10GiB or 10240MiB"
    )


@pytest.mark.parametrize(("bare", "fix"), [("10", "use 10GiB or 10240MiB"), (512, "use 512GiB")])
def test_parse_memory_refuses_a_bare_number_with_the_units_to_use(bare: object, fix: str) -> None:
    with pytest.raises(InvalidValue, match=fix):
        parse_memory(bare, field="gpu memory")


@pytest.mark.parametrize("text", ["1" * 400, 10**400, float("inf"), "1e999"])
def test_parsers_refuse_huge_and_infinite_numbers(text: object) -> None:
    for parse in (parse_gpus, parse_cpus, parse_memory, parse_duration):
        with pytest.raises(InvalidValue):
            parse(text)


@pytest.mark.parametrize("text", ["ten", "10XB", "-5GiB", "1.0001MiB", "GiB"])
def test_parse_memory_rejects_nonsense(text: str) -> None:
    with pytest.raises(InvalidValue, match=r"10GiB or 10240MiB|whole number of MiB"):
        parse_memory(text)


@given(st.integers(min_value=0, max_value=64 * 1024 * 1024))
def test_memory_roundtrip(mib: int) -> None:
    assert parse_memory(format_memory(mib)) == mib


@given(
    st.one_of(
        st.integers(min_value=0, max_value=1000),
        st.integers(min_value=1, max_value=64).map(lambda n: n * 1000),
    )
)
def test_gpu_roundtrip(milli: int) -> None:
    assert parse_gpus(format_gpus(milli)) == milli


@given(st.integers(min_value=0, max_value=512_000))
def test_cpu_roundtrip(milli: int) -> None:
    assert parse_cpus(format_cpus(milli)) == milli


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_duration_roundtrip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_examples() -> None:
    assert format_gpus(500) == "0.5"
    assert format_gpus(333) == "0.333"
    assert format_gpus(2000) == "2"
    assert format_memory(10240) == "10GiB"
    assert format_memory(1536) == "1.5GiB"
    assert format_memory(100) == "100MiB"
    assert format_memory(0) == "0MiB"
    assert format_duration(5400) == "01:30:00"
    assert format_duration(2 * 86400 + 3600) == "2-01:00:00"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),
        ("90:30", 5430),
        ("1:30:00", 5400),
        ("2-12", 216000),
        ("2-12:30", 217800),
        ("2-12:30:15", 217815),
        ("1h30m", 5400),
        ("45s", 45),
        ("2d", 172800),
        ("1d12h", 129600),
        ("10min", 600),
        ("1.5h", 5400),
    ],
)
def test_parse_duration_slurm_and_friendly_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1:2:3:4", "h", "-5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(InvalidValue, match=r"HH:MM:SS|empty"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "milli"), [("2", 2000), ("0.5", 500), ("250m", 250)])
def test_parse_cpus(text: str, milli: int) -> None:
    assert parse_cpus(text) == milli


def test_parse_cpus_rejects() -> None:
    with pytest.raises(InvalidValue, match="not a CPU count"):
        parse_cpus("four")


def test_byte_conversions_round_down() -> None:
    assert bytes_to_mib(mib_to_bytes(80 * 1024)) == 80 * 1024
    assert bytes_to_mib(mib_to_bytes(5) + 1023) == 5
