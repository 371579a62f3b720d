"""The bounds every number meets before use (``domain/bounds.py``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.domain.bounds import (
    GPU_MEMORY_MIB,
    MAX_ARG_BYTES,
    MAX_NUMBER_CHARS,
    exec_text,
    short_number,
)
from gpupool.domain.errors import InvalidValue


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_bound_takes_exactly_the_finite_values_in_its_range(value: float) -> None:
    inside = math.isfinite(value) and GPU_MEMORY_MIB.low <= value <= GPU_MEMORY_MIB.high
    if inside:
        assert GPU_MEMORY_MIB.check(value) == value
    else:
        with pytest.raises(InvalidValue, match="gpu memory"):
            GPU_MEMORY_MIB.check(value)


def test_the_error_names_the_limit_in_its_unit() -> None:
    with pytest.raises(InvalidValue, match=r"more than 1TiB per device"):
        GPU_MEMORY_MIB.check(10.0**20)


def test_number_text_is_bounded_before_it_is_parsed() -> None:
    assert short_number("1" * MAX_NUMBER_CHARS, field="gpus", hint="h") == "1" * MAX_NUMBER_CHARS
    with pytest.raises(InvalidValue, match="more than the 24 digits"):
        short_number("1" * (MAX_NUMBER_CHARS + 1), field="gpus", hint="h")


@pytest.mark.parametrize(
    ("text", "says"), [("a\x00b", "NUL byte"), ("x" * (MAX_ARG_BYTES + 1), "kernel's limit")]
)
def test_exec_text_refuses_what_exec_cannot_pass(text: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        exec_text(text, field="command argument 1")
    assert exec_text("x" * MAX_ARG_BYTES, field="a") == "x" * MAX_ARG_BYTES
